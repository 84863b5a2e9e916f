-- Test init for tests/editors/test_nvim.py: loads editors/nvim exactly as a user would (runtimepath +
-- setup), with the server command and settings passed in through the environment.
vim.opt.runtimepath:prepend(vim.env.DG_TEST_NVIM_RTP)
vim.opt.swapfile = false
vim.opt.shortmess:append('I')

-- Read-only probes for the test driver (called through --remote-expr luaeval(...)).
_G.dg_test = { notified = {} }

-- Record what the user is told (vim.notify), then show it as usual.
local notify = vim.notify
vim.notify = function(msg, level, opts)
  table.insert(dg_test.notified, { msg = msg, level = level })
  return notify(msg, level, opts)
end

require('dg_lsp').setup({
  cmd = vim.json.decode(vim.env.DG_TEST_SERVER_CMD),
  settings = vim.json.decode(vim.env.DG_TEST_SETTINGS),
  root_markers = {},
})

-- Filetype detection must run for vim.lsp.enable's FileType autocmd.
vim.cmd('filetype on')

-- Open the completion menu with one item shaped as vim.lsp.completion makes them from a dg-lsp
-- CompletionItem (menu word cut at the first space, the whole text in user_data), so accepting a
-- multi-line infill goes through Neovim's real completion path whatever the random model says.
function dg_test.offer(text)
  local client = vim.lsp.get_clients({ name = require('dg_lsp').name, bufnr = 0 })[1]
  local col = vim.api.nvim_win_get_cursor(0)[2]
  local range = { start = { line = 0, character = col }, ['end'] = { line = 0, character = col } }
  vim.fn.complete(col + 1, {
    {
      word = text:match('^(%S*)'),
      abbr = text:gsub('\n', ' '),
      user_data = {
        nvim = {
          lsp = {
            client_id = client.id,
            completion_item = { label = text, insertTextFormat = 1, textEdit = { range = range, newText = text } },
          },
        },
      },
    },
  })
  return ''
end

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
    -- The whole text each menu item stands for (the server's textEdit), which accepting must insert.
    pum_texts = vim.tbl_map(function(item)
      local lsp = type(item.user_data) == 'table' and item.user_data.nvim and item.user_data.nvim.lsp or {}
      local c = lsp.completion_item or {}
      return (c.textEdit and c.textEdit.newText) or c.insertText or item.word
    end, vim.fn.complete_info({ 'items' }).items or {}),
    missing = dg.missing,
    notified = dg_test.notified,
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
