-- Neovim 0.12: the shipped editors/nvim setup, inline completion (the request and the ghost text) and
-- fill-holes through the plugin's keymap function. Writes one JSON object and quits.
local env = vim.fn.environ()
local out = env.DIFFU_NVIM_OUT

local function finish(result)
  local f = assert(io.open(out, "w"))
  f:write(vim.json.encode(result))
  f:close()
  vim.cmd("qa!")
end

local ok, err = pcall(function()
  vim.opt.runtimepath:prepend(env.DIFFU_NVIM_PLUGIN)
  require("diffu").setup({
    cmd = vim.json.decode(env.DIFFU_NVIM_CMD),
    settings = vim.json.decode(env.DIFFU_NVIM_INIT),
    keymaps = { fill_holes = "<leader>dh" },
  })
  vim.cmd("edit " .. vim.fn.fnameescape(env.DIFFU_NVIM_FILE))
  local buf = vim.api.nvim_get_current_buf()
  local client
  assert(vim.wait(20000, function()
    client = vim.lsp.get_clients({ bufnr = buf, name = "diffu" })[1]
    return client ~= nil and client.initialized
  end, 20), "diffu did not attach")
  local result = {
    ok = true,
    inline_provider = client.server_capabilities.inlineCompletionProvider ~= nil,
    completion_provider = client.server_capabilities.completionProvider ~= nil,
    inline_enabled = vim.lsp.inline_completion.is_enabled({ bufnr = buf }),
    keymap = vim.fn.maparg("<leader>dh", "n") ~= "" or vim.fn.hasmapto("diffu", "n") == 1,
  }

  -- The request, as Neovim's inline completion makes it.
  local line, character = tonumber(env.DIFFU_NVIM_LINE), tonumber(env.DIFFU_NVIM_CHAR)
  vim.o.virtualedit = "onemore" -- the cursor may sit after the last character, as in insert mode
  vim.api.nvim_win_set_cursor(0, { line + 1, character })
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = 1 }
  local responses = vim.lsp.buf_request_sync(buf, "textDocument/inlineCompletion", params, 30000)
  result.inline = responses and responses[client.id] and responses[client.id].result

  -- Ghost text: enter insert mode at the cursor and let the automatic trigger run.
  local ns = vim.api.nvim_get_namespaces()["nvim.lsp.inline_completion"]
  vim.api.nvim_feedkeys("i", "nx", false)
  vim.cmd("startinsert")
  vim.api.nvim_exec_autocmds("InsertEnter", { buffer = buf })
  vim.api.nvim_exec_autocmds("CursorMovedI", { buffer = buf })
  result.ghost = vim.wait(15000, function()
    ns = ns or vim.api.nvim_get_namespaces()["nvim.lsp.inline_completion"]
    return ns ~= nil and #vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, {}) > 0
  end, 20)
  vim.cmd("stopinsert")

  -- Fill holes, as the <leader>dh keymap does: the server sends workspace/applyEdit to Neovim.
  require("diffu").fill_holes(buf)
  result.filled = vim.wait(30000, function()
    local text = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n")
    return not text:find("???", 1, true)
  end, 20)
  result.lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  finish(result)
end)
if not ok then
  finish({ ok = false, error = tostring(err) })
end
