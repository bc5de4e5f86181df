-- diffu for Neovim 0.12+: infill suggestions as ghost text (textDocument/inlineCompletion), accept all,
-- a word or a line, cycle candidates, fill holes, pause them (:DiffuToggle, :DiffuSnooze [minutes]), and a
-- statusline function. Neovim's own LSP client does the work; this file configures it.
--
--   require("diffu").setup({
--     settings = { debounceMs = 0, maxTokens = 64 },   -- the server's settings (docs/editors.md)
--     keymaps = { accept = "<Tab>", fill_holes = "<leader>dh" },
--   })
--   vim.o.statusline = "%f %= %{v:lua.require'diffu'.status()}"
local M = {}

M.defaults = {
  -- How to start the server; `diffu` must be on PATH (or give the full path to the venv's `diffu`).
  cmd = { "diffu", "lsp" },
  cmd_env = nil,
  -- Filetypes to attach to; nil attaches to every buffer (the server's `languages` setting can narrow it).
  filetypes = nil,
  root_markers = { ".git", "pyproject.toml", "package.json", "Cargo.toml", "go.mod" },
  -- Sent as initializationOptions and as the `diffu` section of workspace/configuration.
  settings = {},
  -- Show suggestions as ghost text while typing (needs vim.lsp.inline_completion, Neovim 0.12).
  inline = true,
  keymaps = {
    accept = "<Tab>", -- insert mode: accept the ghost text, or a plain <Tab> when there is none
    accept_word = "<M-Right>", -- insert mode: accept its next word (copilot.vim's keys)
    accept_line = "<M-C-Right>", -- insert mode: accept the rest of its line
    next = "<M-]>", -- insert mode: the next candidate; with one or none, ask for several explicitly
    prev = "<M-[>", -- insert mode: the previous candidate
    fill_holes = "<leader>dh", -- normal/visual mode: fill the <|mask|> / ??? holes of the file/selection
  },
}

M.options = vim.deepcopy(M.defaults)

-- The last diffu/status notification of each client: { state, message, latencyMs, model }.
local statuses = {}

local function client_for(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = "diffu" })[1]
end

--- The statusline text: "diffu 312ms", "diffu connecting: loading the model", "diffu paused until 14:32"...
--- or "" when not attached.
function M.status(bufnr)
  local client = client_for(bufnr or 0)
  local status = client and statuses[client.id]
  if not status then
    return client and "diffu" or ""
  end
  if status.state == "ready" then
    return status.latencyMs ~= vim.NIL and status.latencyMs and ("diffu %dms"):format(status.latencyMs)
      or "diffu ready"
  end
  if status.state == "busy" then
    return "diffu …"
  end
  if status.message == "" then
    return "diffu " .. status.state
  end
  -- A message that starts with the state ("paused until 14:32") says it already.
  if vim.startswith(status.message, status.state) then
    return "diffu " .. status.message
  end
  return "diffu " .. status.state .. ": " .. status.message
end

local function on_status(_, result, ctx)
  statuses[ctx.client_id] = result
  vim.api.nvim_exec_autocmds("User", { pattern = "DiffuStatus", modeline = false, data = result })
  vim.cmd.redrawstatus({ bang = true })
end

--- The selection as an LSP range (0-based, end exclusive), or nil when not in visual mode.
local function visual_range()
  local mode = vim.fn.mode()
  if not mode:match("^[vV\22]") then
    return nil
  end
  local s, e = vim.fn.getpos("v"), vim.fn.getpos(".")
  if s[2] > e[2] or (s[2] == e[2] and s[3] > e[3]) then
    s, e = e, s
  end
  local end_line, end_col = e[2] - 1, e[3]
  if mode == "V" then
    end_line, end_col = e[2], 0 -- whole lines: up to the start of the next line
  end
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes("<Esc>", true, false, true), "nx", false)
  return {
    start = { line = s[2] - 1, character = mode == "V" and 0 or s[3] - 1 },
    ["end"] = { line = end_line, character = end_col },
  }
end

--- Fill every hole of the selection (visual mode) or of the buffer in one diffusion run.
--- The server applies the result as a workspace edit.
function M.fill_holes(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local client = client_for(bufnr)
  if not client then
    vim.notify("diffu: the language server is not attached to this buffer", vim.log.levels.WARN)
    return
  end
  local range = visual_range()
  client:exec_cmd({
    title = "Fill holes",
    command = "diffu.fillHoles",
    arguments = { vim.uri_from_bufnr(bufnr), range or vim.NIL },
  }, { bufnr = bufnr })
end

--- Run a server command that answers with the status item (toggle, snooze) on the current buffer's server.
local function status_command(command, arguments)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = client_for(bufnr)
  if not client then
    vim.notify("diffu: the language server is not attached to this buffer", vim.log.levels.WARN)
    return
  end
  client:exec_cmd({ title = command, command = command, arguments = arguments }, { bufnr = bufnr }, function(err, result)
    if err then
      vim.notify("diffu: " .. err.message, vim.log.levels.ERROR)
    elseif result then
      on_status(nil, result, { client_id = client.id })
    end
  end)
end

--- Pause suggestions while typing until toggled again, or resume them (`:DiffuToggle`). Explicit
--- requests (`suggest`, the cycle keys) still ask while paused.
function M.toggle()
  status_command("diffu.toggle", {})
end

--- Pause suggestions while typing for `minutes` (`:DiffuSnooze [minutes]`; default: the server's
--- `snoozeMinutes` setting, 5).
function M.snooze(minutes)
  status_command("diffu.snooze", minutes and { minutes } or {})
end

--- The part of `text` to accept: all of it, its next word (spaces before it included), or the rest of
--- its first line (a leading newline and the line after it, when it starts with one).
function M.part(text, how)
  if how == "word" then
    return text:match("^%s*[%w_]+") or text:match("^%s*[^%w_%s]+") or text:match("^%s+") or text
  elseif how == "line" then
    return text:match("^\n[^\n]*") or text:match("^[^\n]+") or text
  end
  return text
end

--- The text an item would still insert at the cursor, or nil when it belongs elsewhere (the cursor
--- moved off its range, or what was typed since does not continue it): accepting it would insert a
--- stale suggestion in the wrong place.
local function remaining(bufnr, item)
  local range, text = item.range, item.insert_text
  if type(text) ~= "string" then
    return nil
  end
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  if not range then
    return text
  end
  if range.start.row ~= row - 1 or range.end_.row ~= row - 1 or col < range.end_.col then
    return nil
  end
  local line = vim.api.nvim_buf_get_lines(bufnr, row - 1, row, true)[1]
  local typed = line:sub(range.start.col + 1, col)
  if text:sub(1, #typed) ~= typed then
    return nil
  end
  return text:sub(#typed + 1)
end

local function feed(keys)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(keys, true, false, true), "n", false)
end

--- Accept the shown suggestion (`how`: "all", "word" or "line") at the cursor. Returns false when none
--- is shown; a stale one is dropped and `fallback` keys are typed instead.
function M.accept(bufnr, how, fallback)
  return vim.lsp.inline_completion.get({
    bufnr = bufnr,
    on_accept = function(item)
      local rest = remaining(bufnr, item)
      if not rest then
        if fallback then
          feed(fallback)
        end
        return
      end
      local part = M.part(rest, how)
      local lines = vim.split(part, "\n", { plain = true })
      local row, col = unpack(vim.api.nvim_win_get_cursor(0))
      vim.api.nvim_buf_set_text(bufnr, row - 1, col, row - 1, col, lines)
      local last = #lines == 1 and col + #lines[1] or #lines[#lines]
      vim.api.nvim_win_set_cursor(0, { row + #lines - 1, last })
      if part == rest and item.command then
        -- The whole suggestion is in: the server counts it (locally; nothing is sent anywhere).
        local client = vim.lsp.get_client_by_id(item.client_id)
        if client then
          client:exec_cmd(item.command, { bufnr = bufnr })
        end
      end
    end,
  })
end

-- Neovim 0.12 has no public way to make an explicit (Invoked) inline completion request, which is what
-- gets several candidates; its per-buffer completer has one, reached through a private table.
local function completer(bufnr)
  local ok, capability = pcall(require, "vim.lsp._capability")
  local class = ok and type(capability.all) == "table" and capability.all.inline_completion
  return class and class.active and class.active[bufnr] or nil
end

--- Ask for suggestions explicitly (several candidates, more denoising steps), as if invoked by a key.
function M.suggest(bufnr)
  local c = completer(bufnr or vim.api.nvim_get_current_buf())
  if c and c.request then
    c:request(vim.lsp.protocol.InlineCompletionTriggerKind.Invoked)
    return true
  end
  return false
end

--- Show the next (`count` 1) or previous (-1) candidate; with one or none to cycle, ask for several.
function M.cycle(bufnr, count)
  local c = completer(bufnr)
  if c and c.count_items and c:count_items() <= 1 then
    M.suggest(bufnr)
    return
  end
  vim.lsp.inline_completion.select({ bufnr = bufnr, count = count })
end

local function map_accept(bufnr, lhs, how, fallback)
  vim.keymap.set("i", lhs, function()
    if not M.accept(bufnr, how, fallback) then
      return fallback or ""
    end
    return ""
  end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = "diffu: accept " .. how })
end

-- Neovim 0.12 makes inline completion's autocommands global: every buffer with it enabled asks on each
-- cursor move in any buffer, with the current window's cursor. Keep it enabled in the current buffer only.
local function follow_current_buffer(bufnr)
  local group = vim.api.nvim_create_augroup("diffu.inline." .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd("BufEnter", {
    group = group,
    buffer = bufnr,
    callback = function()
      vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
    end,
  })
  vim.api.nvim_create_autocmd("BufLeave", {
    group = group,
    buffer = bufnr,
    callback = function()
      vim.lsp.inline_completion.enable(false, { bufnr = bufnr })
    end,
  })
  vim.lsp.inline_completion.enable(bufnr == vim.api.nvim_get_current_buf(), { bufnr = bufnr })
end

-- Neovim 0.12 keeps the ghost text after typing that does not continue it, shifted by the characters
-- typed (`Z` over `return item` shows `eturn item`), until the next answer comes. Hide it as soon as the
-- typed text leaves it; while the typed text is its start, Neovim shows the rest.
local function hide_when_diverged(bufnr)
  vim.api.nvim_create_autocmd({ "TextChangedI", "TextChangedP" }, {
    group = vim.api.nvim_create_augroup("diffu.ghost." .. bufnr, { clear = true }),
    buffer = bufnr,
    callback = function()
      local c = completer(bufnr)
      if c and c.current and not remaining(bufnr, c.current) then
        c:hide()
        c.current = nil
        for _, state in pairs(c.client_state) do
          state.items = nil -- nor shown again by cycling
        end
      end
    end,
  })
end

local function on_attach(_, bufnr)
  local opts = M.options
  local keys = opts.keymaps
  if opts.inline and vim.lsp.inline_completion then
    follow_current_buffer(bufnr)
    hide_when_diverged(bufnr)
    if keys.accept then
      map_accept(bufnr, keys.accept, "all", keys.accept)
    end
    if keys.accept_word then
      map_accept(bufnr, keys.accept_word, "word", nil)
    end
    if keys.accept_line then
      map_accept(bufnr, keys.accept_line, "line", nil)
    end
    for lhs, count in pairs({ [keys.next or false] = 1, [keys.prev or false] = -1 }) do
      if lhs then
        vim.keymap.set("i", lhs, function()
          M.cycle(bufnr, count)
        end, { buffer = bufnr, desc = "diffu: " .. (count > 0 and "next" or "previous") .. " suggestion" })
      end
    end
  end
  if keys.fill_holes then
    vim.keymap.set({ "n", "x" }, keys.fill_holes, function()
      M.fill_holes(bufnr)
    end, { buffer = bufnr, desc = "diffu: fill holes" })
  end
end

function M.setup(opts)
  M.options = vim.tbl_deep_extend("force", vim.deepcopy(M.defaults), opts or {})
  local o = M.options
  vim.lsp.config("diffu", {
    cmd = o.cmd,
    cmd_env = o.cmd_env,
    filetypes = o.filetypes,
    root_markers = o.root_markers,
    init_options = o.settings,
    settings = { diffu = o.settings },
    handlers = { ["diffu/status"] = on_status },
  })
  vim.api.nvim_create_user_command("DiffuToggle", function()
    M.toggle()
  end, { desc = "diffu: pause or resume suggestions while typing" })
  vim.api.nvim_create_user_command("DiffuSnooze", function(cmd)
    local minutes = tonumber(cmd.args)
    if cmd.args ~= "" and not minutes then
      vim.notify("diffu: :DiffuSnooze takes minutes, e.g. :DiffuSnooze 30", vim.log.levels.ERROR)
      return
    end
    M.snooze(minutes)
  end, { nargs = "?", desc = "diffu: pause suggestions while typing for a while (minutes)" })
  vim.api.nvim_create_autocmd("LspAttach", {
    group = vim.api.nvim_create_augroup("diffu", { clear = true }),
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if client and client.name == "diffu" then
        on_attach(client, args.buf)
      end
    end,
  })
  vim.lsp.enable("diffu")
end

return M
