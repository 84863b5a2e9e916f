-- Test init for tests/editors/test_nvim.py: loads editors/nvim exactly as a user would (runtimepath +
-- setup), with the server command and settings passed in through the environment.
vim.opt.runtimepath:prepend(vim.env.DG_TEST_NVIM_RTP)
vim.opt.swapfile = false
vim.opt.shortmess:append('I')

require('dg_lsp').setup({
  cmd = vim.json.decode(vim.env.DG_TEST_SERVER_CMD),
  settings = vim.json.decode(vim.env.DG_TEST_SETTINGS),
  root_markers = {},
})

-- Filetype detection must run for vim.lsp.enable's FileType autocmd.
vim.cmd('filetype on')

-- Read-only probes for the test driver (called through --remote-expr luaeval(...)).
_G.dg_test = {}

function dg_test.state()
  local dg = require('dg_lsp')
  local buf = vim.api.nvim_get_current_buf()
  local clients = vim.lsp.get_clients({ name = dg.name, bufnr = buf })
  return vim.json.encode({
    version = tostring(vim.version()),
    attached = #clients > 0,
    ready = dg.ready(buf),
    mode = dg.mode(),
    status = dg.status(),
    vim_mode = vim.api.nvim_get_mode().mode,
    pum = vim.fn.pumvisible() == 1,
    pum_words = vim.tbl_map(function(item)
      return item.word
    end, vim.fn.complete_info({ 'items' }).items or {}),
    lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false),
    cursor = vim.api.nvim_win_get_cursor(0),
    tick = vim.api.nvim_buf_get_changedtick(buf),
    ghost = #vim.api.nvim_buf_get_extmarks(
      buf,
      vim.api.nvim_create_namespace('nvim.lsp.inline_completion'),
      0,
      -1,
      {}
    ),
    messages = vim.fn.execute('messages'),
  })
end

-- Number of completion items the server returns at the cursor right now (a synchronous request).
function dg_test.completion_count()
  local params = vim.lsp.util.make_position_params(0, 'utf-16')
  local responses = vim.lsp.buf_request_sync(0, 'textDocument/completion', params, 60000) or {}
  local count = 0
  for _, response in pairs(responses) do
    local result = response.result or {}
    count = count + #(result.items or result)
  end
  return count
end
