-- Neovim 0.12 with the shipped editors/nvim setup and a file open, for tests that type into it key by key
-- (nvim --server ... --remote-send) and read its state back (--remote-expr).
local env = vim.fn.environ()
vim.opt.runtimepath:prepend(env.DIFFU_NVIM_PLUGIN)
require("diffu").setup({
  cmd = vim.json.decode(env.DIFFU_NVIM_CMD),
  settings = vim.json.decode(env.DIFFU_NVIM_INIT),
})
vim.cmd("edit " .. vim.fn.fnameescape(env.DIFFU_NVIM_FILE))

local function ghosts()
  local ns = vim.api.nvim_get_namespaces()["nvim.lsp.inline_completion"]
  local found = {}
  if ns then
    for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
      local text = {}
      for _, chunk in ipairs(mark[4].virt_text or {}) do
        table.insert(text, chunk[1])
      end
      table.insert(found, { row = mark[2], text = table.concat(text) })
    end
  end
  return found
end

-- What was on screen right after each keystroke typed in insert mode: the cursor's line and the ghost
-- text, read once the keystroke's autocommands have run (scheduled from TextChangedI), before an answer to
-- a request it causes can arrive (Neovim waits 200 ms before it asks).
local typed = {}
vim.api.nvim_create_autocmd("TextChangedI", {
  callback = function()
    vim.schedule(function()
      table.insert(typed, { line = vim.api.nvim_get_current_line(), ghosts = ghosts() })
    end)
  end,
})

-- What the test reads: whether the server is attached, and the ghost text on screen (row, text).
function _G.diffu_test_state()
  local client = vim.lsp.get_clients({ bufnr = 0, name = "diffu" })[1]
  -- The number of candidates Neovim holds (its completer is private; a test may look).
  local completer = require("vim.lsp._capability").all.inline_completion.active[vim.api.nvim_get_current_buf()]
  return vim.json.encode({
    items = completer and completer:count_items() or 0,
    attached = client ~= nil and client.initialized or false,
    ghosts = ghosts(),
    typed = typed,
    mode = vim.api.nvim_get_mode().mode,
    cursor = vim.api.nvim_win_get_cursor(0),
    status = require("diffu").status(),
  })
end

-- The server's diffu.status (counters, settings), asked through Neovim's client as a plugin would.
function _G.diffu_test_server_status()
  local client = vim.lsp.get_clients({ bufnr = 0, name = "diffu" })[1]
  local answer = client and client:request_sync("workspace/executeCommand", { command = "diffu.status" }, 10000, 0)
  return vim.json.encode(answer and answer.result or {})
end
