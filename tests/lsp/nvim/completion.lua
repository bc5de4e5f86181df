-- Neovim 0.7+: attach `diffu lsp` with Neovim's own client and ask for a completion in a buffer.
-- Driven by tests/lsp/test_neovim.py through environment variables; writes one JSON object and quits.
local env = vim.fn.environ()
local out = env.DIFFU_NVIM_OUT

local function finish(result)
  local f = assert(io.open(out, "w"))
  f:write(vim.json.encode(result))
  f:close()
  vim.cmd("qa!")
end

local ok, err = pcall(function()
  vim.cmd("edit " .. vim.fn.fnameescape(env.DIFFU_NVIM_FILE))
  local buf = vim.api.nvim_get_current_buf()
  local initialized = false
  local id = vim.lsp.start_client({
    name = "diffu",
    cmd = vim.json.decode(env.DIFFU_NVIM_CMD),
    cmd_cwd = env.DIFFU_NVIM_CWD,
    root_dir = vim.fn.fnamemodify(env.DIFFU_NVIM_FILE, ":h"),
    init_options = vim.json.decode(env.DIFFU_NVIM_INIT),
    on_init = function()
      initialized = true
    end,
  })
  vim.lsp.buf_attach_client(buf, id)
  assert(vim.wait(20000, function()
    return initialized
  end, 20), "the server did not initialize")
  local client = vim.lsp.get_client_by_id(id)
  local line, character = tonumber(env.DIFFU_NVIM_LINE), tonumber(env.DIFFU_NVIM_CHAR)
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(buf) },
    position = { line = line, character = character },
    context = { triggerKind = 1 },
  }
  local responses = vim.lsp.buf_request_sync(buf, "textDocument/completion", params, 30000)
  local response = responses and responses[id] or {}
  finish({
    ok = true,
    version = vim.version(),
    has_completion_provider = client.server_capabilities.completionProvider ~= nil,
    result = response.result,
    err = response.err and tostring(response.err.message) or nil,
  })
end)
if not ok then
  finish({ ok = false, error = tostring(err) })
end
