--- dg-lsp client for Neovim >= 0.11.
---
--- Registers the server with `vim.lsp.config`/`vim.lsp.enable`; on attach it turns on ghost text
--- (`vim.lsp.inline_completion`, Neovim >= 0.12) or, on older versions, LSP completion
--- (`vim.lsp.completion`) as the fallback, and sets buffer-local accept/dismiss/cycle keymaps that fall
--- through to the key's normal meaning when there is nothing to accept.
---
--- Usage: require('dg_lsp').setup({ settings = { maxTokens = 32 } })
local M = {}

M.name = 'dg_lsp'

--- Titles the server gives its code actions, by the short name used in :DgLspAction.
M.actions = {
  fill = 'Fill in here (dg-lsp)',
  rewrite = 'Rewrite selection (dg-lsp)',
  placeholder = 'Fill placeholder (dg-lsp)',
  repair = 'Repair syntax error (dg-lsp)',
}

M.defaults = {
  --- Server command; `{ '/path/to/venv/bin/python', '-m', 'dg_lsp' }` works too.
  cmd = { 'dg-lsp' },
  --- nil attaches to every filetype (the server filters with its `enabledLanguages` setting).
  filetypes = nil,
  root_markers = { '.git' },
  --- Server settings, camelCase as in the server docs, e.g. { model = '...', maxTokens = 32 }.
  --- Sent as initializationOptions and workspace/didChangeConfiguration under `dgLsp`.
  settings = {},
  --- 'auto': ghost text where the Neovim version has it, completion fallback otherwise;
  --- false: always use the completion fallback.
  inline = 'auto',
  --- Fallback only: open the completion menu on the server's trigger characters while typing.
  autotrigger = true,
  --- Fallback only: buffer-local 'completeopt' (menuone so a single infill still shows a menu,
  --- noinsert so nothing changes until accepted). false leaves 'completeopt' alone.
  completeopt = 'menuone,noinsert,popup',
  --- Insert-mode keys; set one to false to skip it, or `keymaps = false` for none.
  keymaps = {
    accept = '<Tab>',
    dismiss = '<C-]>',
    next = '<M-]>',
    prev = '<M-[>',
    trigger = '<C-Space>',
  },
  --- Echo model-loading progress (window/workDoneProgress) in the message area.
  progress = true,
}

M.config = vim.deepcopy(M.defaults)

--- Live progress per client id: { title, message?, percentage? }; nil when none is running.
M.progress = {}
--- Client ids that have finished at least one progress (the model load) since starting.
M.loaded = {}
--- Client id -> the server's message when its last model load failed ("failed: ..."); nil once a load
--- succeeds.
M.failed = {}

--- Install commands that work: dg-lsp is installed from a clone of its repository, not from PyPI
--- (torch first, pinned, so pip does not pull a multi-GB CUDA build).
M.install_hint = 'from a clone of the dg-lsp repository: pip install torch==2.13.0 && pip install -e .'
  .. ' (or pipx install --preinstall torch==2.13.0 .)'

local has_inline = vim.lsp.inline_completion ~= nil and vim.fn.has('nvim-0.12') == 1

--- 'inline' or 'completion': how infills are presented with the current config and Neovim.
function M.mode()
  if M.config.inline and has_inline then
    return 'inline'
  end
  return 'completion'
end

local function clients(bufnr)
  return vim.lsp.get_clients({ name = M.name, bufnr = bufnr })
end

local function pumvisible()
  return vim.fn.pumvisible() == 1
end

local function termcodes(keys)
  return vim.api.nvim_replace_termcodes(keys, true, false, true)
end

--- Accept the shown infill. Returns false when there is none, so expr-mappings can fall through.
function M.accept()
  if M.mode() == 'inline' then
    return vim.lsp.inline_completion.get()
  end
  if pumvisible() then
    -- <C-y> confirms the selected item; vim.lsp.completion then applies its textEdit.
    vim.api.nvim_feedkeys(termcodes('<C-y>'), 'n', false)
    return true
  end
  return false
end

--- Hide the shown infill. Returns false when nothing was shown.
function M.dismiss()
  local bufnr = vim.api.nvim_get_current_buf()
  if M.mode() == 'inline' then
    if not vim.lsp.inline_completion.is_enabled({ bufnr = bufnr }) then
      return false
    end
    -- 0.12 has no public "dismiss": re-enabling drops the candidate and pending requests; the next
    -- keystroke asks again.
    vim.lsp.inline_completion.enable(false, { bufnr = bufnr })
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
    return true
  end
  if pumvisible() then
    vim.api.nvim_feedkeys(termcodes('<C-e>'), 'n', false)
    return true
  end
  return false
end

--- Show the next (count > 0) or previous candidate.
function M.cycle(count)
  if M.mode() == 'inline' then
    vim.lsp.inline_completion.select({ count = count })
  elseif pumvisible() then
    vim.api.nvim_feedkeys(termcodes(count > 0 and '<C-n>' or '<C-p>'), 'n', false)
  end
end

--- Ask for an infill now (fallback: opens the completion menu).
function M.trigger()
  if M.mode() == 'completion' then
    vim.lsp.completion.get()
  end
  -- Inline mode requests on its own while typing.
end

--- Neovim 0.11 inserts a plain-text completion item only up to its first whitespace (the menu word
--- is cut there), and dg-lsp's items are whole infills, often several lines: `return value` went in as
--- `return`. After the menu inserted the word, put the item's whole text in its place.
local function insert_whole_item(bufnr)
  local completed = vim.v.completed_item
  local data = type(completed) == 'table' and completed.user_data
  local lsp_data = type(data) == 'table' and type(data.nvim) == 'table' and data.nvim.lsp
  local item = type(lsp_data) == 'table' and lsp_data.completion_item
  if type(item) ~= 'table' then
    return
  end
  local client = vim.lsp.get_client_by_id(lsp_data.client_id)
  if not client or client.name ~= M.name or item.insertTextFormat == 2 then
    return -- not ours, or a snippet (Neovim expands those whole itself)
  end
  local text = (item.textEdit and item.textEdit.newText) or item.insertText or item.label
  local word = completed.word or ''
  if type(text) ~= 'string' or text == word then
    return
  end
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  row = row - 1
  local start = col - #word
  if start < 0 or vim.api.nvim_buf_get_text(bufnr, row, start, row, col, {})[1] ~= word then
    return -- the word is not right before the cursor: leave the buffer alone
  end
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, row, start, row, col, lines)
  local last = #lines == 1 and start + #lines[1] or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + #lines, last })
end

local function set_keymaps(bufnr)
  local keys = M.config.keymaps
  if not keys then
    return
  end
  local function map(lhs, fn, desc)
    if lhs then
      vim.keymap.set('i', lhs, fn, { buffer = bufnr, expr = true, desc = 'dg-lsp: ' .. desc })
    end
  end
  -- Each returns '' when it handled the key and the key itself otherwise, so <Tab> still indents.
  map(keys.accept, function()
    return M.accept() and '' or termcodes(keys.accept)
  end, 'accept infill')
  map(keys.dismiss, function()
    return M.dismiss() and '' or termcodes(keys.dismiss)
  end, 'dismiss infill')
  map(keys.next, function()
    M.cycle(1)
    return ''
  end, 'next infill')
  map(keys.prev, function()
    M.cycle(-1)
    return ''
  end, 'previous infill')
  map(keys.trigger, function()
    M.trigger()
    return ''
  end, 'request infill')
end

local function on_attach(client, bufnr)
  if M.mode() == 'inline' and client:supports_method('textDocument/inlineCompletion', bufnr) then
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  elseif client:supports_method('textDocument/completion', bufnr) then
    if M.config.completeopt then
      vim.bo[bufnr].completeopt = M.config.completeopt
    end
    vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = M.config.autotrigger })
    vim.api.nvim_create_autocmd('CompleteDone', {
      group = vim.api.nvim_create_augroup('dg_lsp_complete_' .. bufnr, { clear = true }),
      buffer = bufnr,
      callback = function()
        insert_whole_item(bufnr)
      end,
      desc = 'dg-lsp: insert the whole infill, not only the menu word',
    })
  end
  set_keymaps(bufnr)
end

local function on_progress(ev)
  local data = ev.data or {}
  local client = vim.lsp.get_client_by_id(data.client_id)
  if not client or client.name ~= M.name then
    return
  end
  local value = (data.params or {}).value or {}
  if value.kind == 'begin' then
    M.progress[client.id] = { title = value.title, message = value.message, percentage = value.percentage }
  elseif value.kind == 'report' and M.progress[client.id] then
    local p = M.progress[client.id]
    p.message = value.message or p.message
    p.percentage = value.percentage or p.percentage
  elseif value.kind == 'end' then
    M.progress[client.id] = nil
    M.loaded[client.id] = true
    -- The server ends its load progress with "failed: <why>" when the model could not load.
    if type(value.message) == 'string' and value.message:match('^failed') then
      M.failed[client.id] = value.message
      vim.notify(
        ('dg-lsp: the model %s. Completions stay empty until it loads; `dg-lsp doctor` says what is wrong.'):format(
          value.message
        ),
        vim.log.levels.ERROR
      )
    else
      M.failed[client.id] = nil
    end
  end
  if M.config.progress and not M.failed[client.id] then
    local text = M.status()
    if value.kind == 'end' then
      text = 'dg-lsp: ' .. (value.message or 'ready')
    end
    vim.api.nvim_echo({ { text } }, false, {})
  end
end

--- Statusline text: the running progress ("dg-lsp: loading model 40%"), 'dg-lsp: model failed' after
--- a failed load, 'dg-lsp' when attached and idle, '' when not attached to the current buffer.
function M.status()
  for _, client in ipairs(clients(0)) do
    local p = M.progress[client.id]
    if p then
      local pct = p.percentage and (' %d%%'):format(p.percentage) or ''
      local msg = p.message and (' (' .. p.message .. ')') or ''
      return (p.title or 'dg-lsp') .. pct .. msg
    end
    if M.failed[client.id] then
      return 'dg-lsp: model failed'
    end
  end
  if #clients(0) > 0 then
    return 'dg-lsp'
  end
  return M.missing and 'dg-lsp: not found' or ''
end

--- True once the server attached to `bufnr` has loaded its model (a failed load is not ready).
function M.ready(bufnr)
  for _, client in ipairs(clients(bufnr or 0)) do
    if client.initialized and M.loaded[client.id] and not M.progress[client.id] and not M.failed[client.id] then
      return true
    end
  end
  return false
end

--- Merge `settings` into the running servers' settings and notify them (no restart needed).
function M.update_settings(settings)
  -- Shallow on purpose: each key replaces the old value (lists such as enabledLanguages included).
  for key, value in pairs(settings) do
    M.config.settings[key] = value
  end
  for _, client in ipairs(vim.lsp.get_clients({ name = M.name })) do
    client.settings = client.settings or {}
    client.settings.dgLsp = vim.deepcopy(M.config.settings)
    client:notify('workspace/didChangeConfiguration', { settings = client.settings })
  end
end

--- Run a dg-lsp code action. `which` is a key of M.actions or nil for a menu of all of them; with
--- a single match it is applied without asking. `range` is {start={row,col}, ['end']={row,col}}.
function M.code_action(which, range)
  local title = which and M.actions[which]
  if which and not title then
    error(('dg-lsp: unknown action %q (one of: fill, rewrite, placeholder, repair)'):format(which))
  end
  vim.lsp.buf.code_action({
    filter = function(action)
      if title then
        return action.title == title
      end
      return action.title:find('(dg-lsp)', 1, true) ~= nil
    end,
    apply = title ~= nil,
    range = range,
  })
end

local function create_commands()
  vim.api.nvim_create_user_command('DgLspAction', function(args)
    local range
    if args.range > 0 then
      local last = vim.api.nvim_buf_get_lines(0, args.line2 - 1, args.line2, true)[1]
      range = { start = { args.line1, 0 }, ['end'] = { args.line2, #last } }
    end
    M.code_action(args.fargs[1], range)
  end, {
    nargs = '?',
    range = true,
    complete = function()
      return vim.tbl_keys(M.actions)
    end,
    desc = 'dg-lsp code action: fill | rewrite | placeholder | repair (no argument: choose)',
  })
  vim.api.nvim_create_user_command('DgLspStatus', function()
    local text = M.status()
    vim.api.nvim_echo({ { text ~= '' and (text .. ' [' .. M.mode() .. ']') or 'dg-lsp: not attached' } }, false, {})
  end, { desc = 'dg-lsp: show server and model-loading state' })
end

--- Register and enable the server. Safe to call again to change options.
function M.setup(opts)
  if vim.fn.has('nvim-0.11') == 0 or not vim.lsp.config then
    vim.notify('dg-lsp: needs Neovim >= 0.11 (vim.lsp.config)', vim.log.levels.ERROR)
    return
  end
  opts = opts or {}
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts)
  -- Lists (and the flat settings table) replace the defaults; deep-extend would merge them index by
  -- index, so a shorter `cmd` would keep the default's tail.
  for _, key in ipairs({ 'cmd', 'filetypes', 'root_markers', 'settings' }) do
    if opts[key] ~= nil then
      M.config[key] = vim.deepcopy(opts[key])
    end
  end
  if opts.keymaps == false then
    M.config.keymaps = false
  end
  local settings = M.config.settings
  vim.lsp.config(M.name, {
    cmd = M.config.cmd,
    on_exit = function(code, signal)
      if code ~= 0 and signal ~= 15 then
        vim.schedule(function()
          vim.notify(
            ('dg-lsp exited with code %s; see :LspLog (`dg-lsp doctor` checks the install)'):format(code),
            vim.log.levels.ERROR
          )
        end)
      end
    end,
    filetypes = M.config.filetypes,
    root_markers = M.config.root_markers,
    init_options = { dgLsp = settings },
    settings = { dgLsp = settings },
  })

  local group = vim.api.nvim_create_augroup('dg_lsp', { clear = true })
  vim.api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(ev)
      local client = vim.lsp.get_client_by_id(ev.data.client_id)
      if client and client.name == M.name then
        on_attach(client, ev.buf)
      end
    end,
  })
  vim.api.nvim_create_autocmd('LspProgress', { group = group, callback = on_progress })
  vim.api.nvim_create_autocmd('LspDetach', {
    group = group,
    callback = function(ev)
      M.progress[ev.data.client_id] = nil
    end,
  })
  -- Neovim skips a server whose command is not executable without a word to the user.
  local exe = type(M.config.cmd) == 'table' and M.config.cmd[1]
  if exe and vim.fn.executable(exe) == 0 then
    M.missing = exe
    vim.notify(
      ('dg-lsp: `%s` was not found, so no infills. Install it %s, or pass `cmd` to setup()'):format(
        exe,
        M.install_hint
      ) .. " (e.g. { '/path/to/venv/bin/python', '-m', 'dg_lsp' }).",
      vim.log.levels.ERROR
    )
  else
    M.missing = nil
  end
  create_commands()
  vim.lsp.enable(M.name)
end

return M
