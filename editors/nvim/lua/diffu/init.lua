-- diffu for Neovim 0.12+: infill completions as ghost text (textDocument/inlineCompletion) and
-- fill-holes, from `diffu lsp`. Neovim's own LSP client does the work; this file only configures it.
--
--   require("diffu").setup({
--     settings = { debounceMs = 150, maxTokens = 64 },   -- the server's settings (docs/editors.md)
--     keymaps = { accept = "<Tab>", fill_holes = "<leader>dh" },
--   })
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
    next = "<M-]>", -- insert mode: cycle to the next suggestion
    fill_holes = "<leader>dh", -- normal/visual mode: fill the <|mask|> / ??? holes of the file/selection
  },
}

M.options = vim.deepcopy(M.defaults)

local function client_for(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = "diffu" })[1]
end

--- The selection as an LSP range (0-based, end exclusive), or nil when not in visual mode.
local function visual_range(bufnr)
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
  local range = visual_range(bufnr)
  client:exec_cmd({
    title = "Fill holes",
    command = "diffu.fillHoles",
    arguments = { vim.uri_from_bufnr(bufnr), range or vim.NIL },
  }, { bufnr = bufnr })
end

local function on_attach(client, bufnr)
  local opts = M.options
  if opts.inline and vim.lsp.inline_completion then
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
    if opts.keymaps.accept then
      vim.keymap.set("i", opts.keymaps.accept, function()
        if not vim.lsp.inline_completion.get({ bufnr = bufnr }) then
          return opts.keymaps.accept
        end
      end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = "diffu: accept suggestion" })
    end
    if opts.keymaps.next then
      vim.keymap.set("i", opts.keymaps.next, function()
        vim.lsp.inline_completion.select({ bufnr = bufnr })
      end, { buffer = bufnr, desc = "diffu: next suggestion" })
    end
  end
  if opts.keymaps.fill_holes then
    vim.keymap.set({ "n", "x" }, opts.keymaps.fill_holes, function()
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
  })
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
