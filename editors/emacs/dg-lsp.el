;;; dg-lsp.el --- Diffusion code infill (dg-lsp) through Eglot  -*- lexical-binding: t; -*-

;; Version: 0.1.0
;; Package-Requires: ((emacs "28.1") (eglot "1.9"))
;; Keywords: languages, tools, convenience
;; SPDX-License-Identifier: Apache-2.0

;;; Commentary:

;; Registers the dg-lsp language server with Eglot.  Eglot has no inline
;; (ghost-text) completion, so infills arrive through `completion-at-point'
;; (the completion fallback: any completion UI on top of it works), and the
;; server's code actions run with `dg-lsp-fill', `dg-lsp-rewrite',
;; `dg-lsp-fill-placeholder', `dg-lsp-repair' or `dg-lsp-code-action'.
;;
;; Eglot manages one server per buffer.  `dg-lsp-setup' lets a buffer keep
;; the language server Eglot would start for it when that server is
;; installed; every other buffer of `dg-lsp-modes' gets dg-lsp (so a Python
;; buffer without pylsp or pyright gets dg-lsp).  Set `dg-lsp-prefer' to use
;; dg-lsp even where the mode's own server is installed.
;;
;;   (require 'dg-lsp)
;;   (setq dg-lsp-settings '(:maxTokens 32))
;;   (dg-lsp-setup)
;;   (add-hook 'prog-mode-hook #'eglot-ensure)
;;
;; Model-loading progress ($/progress) is shown in the echo area and by
;; `dg-lsp-status'.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'eglot)
(require 'jsonrpc)

(defgroup dg-lsp nil
  "Code infill from diffusion language models via the dg-lsp server."
  :group 'eglot
  :prefix "dg-lsp-")

(defcustom dg-lsp-command '("dg-lsp")
  "Command that starts the server over stdio.
A Python interpreter works too: (\"/path/to/python\" \"-m\" \"dg_lsp\")."
  :type '(repeat string))

(defcustom dg-lsp-settings nil
  "Server settings as a plist with the server's camelCase keys.
For example (:model \"embedded\" :maxTokens 32 :enabledLanguages [\"python\"]).
Unset keys keep the server's defaults.  Sent as initializationOptions
under `dgLsp'; change them at run time with `dg-lsp-update-settings'."
  :type 'plist)

(defcustom dg-lsp-modes '(prog-mode text-mode)
  "Major modes (and modes derived from them) that dg-lsp serves."
  :type '(repeat symbol))

(defcustom dg-lsp-prefer nil
  "Non-nil: use dg-lsp for `dg-lsp-modes' even where their own server is.
Eglot runs one server per buffer, so this replaces their language server.
Nil: a buffer whose mode has an installed language server keeps it."
  :type 'boolean)

(defconst dg-lsp-action-titles
  '((fill . "Fill in here (dg-lsp)")
    (rewrite . "Rewrite selection (dg-lsp)")
    (placeholder . "Fill placeholder (dg-lsp)")
    (repair . "Repair syntax error (dg-lsp)"))
  "Title prefixes of the server's code actions.")

(defclass dg-lsp-server (eglot-lsp-server)
  ((progress :initform nil
             :documentation "Alist (TOKEN . PLIST) of running progress.")
   (loaded :initform nil
           :documentation "Non-nil once a progress (the model load) ended.")
   (failed :initform nil
           :documentation "The server's message when the last model load failed, else nil."))
  :documentation "Eglot server class for dg-lsp.")

(defun dg-lsp--settings ()
  "The settings object sent to the server: `dg-lsp-settings' or {}."
  (or dg-lsp-settings (make-hash-table)))

(cl-defmethod eglot-initialization-options ((_server dg-lsp-server))
  "Send `dg-lsp-settings' under the `dgLsp' key."
  (list :dgLsp (dg-lsp--settings)))

(cl-defmethod eglot-client-capabilities ((_server dg-lsp-server))
  "Eglot's capabilities plus window/workDoneProgress, so model loading is shown."
  (let* ((caps (copy-sequence (cl-call-next-method)))
         (window (copy-sequence (plist-get caps :window))))
    (plist-put caps :window (plist-put window :workDoneProgress t))))

(cl-defmethod eglot-handle-request
  ((_server dg-lsp-server) (_method (eql window/workDoneProgress/create)) &rest _params)
  "Accept progress tokens; reports arrive as $/progress."
  nil)

(cl-defmethod eglot-handle-notification
  ((server dg-lsp-server) (_method (eql $/progress)) &key token value)
  "Track and echo the server's progress VALUE for TOKEN."
  (let* ((kind (plist-get value :kind))
         (slot (assoc token (oref server progress))))
    (pcase kind
      ("begin"
       (oset server progress
             (cons (cons token (list :title (plist-get value :title)
                                     :message (plist-get value :message)
                                     :percentage (plist-get value :percentage)))
                   (oref server progress))))
      ("report"
       (when slot
         (dolist (key '(:message :percentage))
           (when (plist-member value key)
             (setcdr slot (plist-put (cdr slot) key (plist-get value key)))))))
      ("end"
       (oset server progress (assoc-delete-all token (oref server progress)))
       (oset server loaded t)
       ;; The server ends its load progress with "failed: <why>" when the model could not load.
       (let ((end-message (plist-get value :message)))
         (oset server failed (and (stringp end-message)
                                  (string-prefix-p "failed" end-message)
                                  end-message)))))
    (let ((inhibit-message (and (not (string= kind "end")) (minibufferp))))
      (message "%s" (if (string= kind "end")
                        (format "dg-lsp: %s" (or (plist-get value :message) "ready"))
                      (dg-lsp--progress-text server))))))

(defun dg-lsp--progress-text (server)
  "One line describing SERVER's newest running progress, or nil."
  (when-let ((p (cdar (oref server progress))))
    (concat (or (plist-get p :title) "dg-lsp")
            (when (numberp (plist-get p :percentage))
              (format " %d%%" (plist-get p :percentage)))
            (when (plist-get p :message)
              (format " (%s)" (plist-get p :message))))))

(defun dg-lsp--server ()
  "The dg-lsp server managing the current buffer, or nil."
  (let ((server (eglot-current-server)))
    (and (cl-typep server 'dg-lsp-server) server)))

(defun dg-lsp-ready-p ()
  "Non-nil when the current buffer's dg-lsp server has loaded its model."
  (when-let ((server (dg-lsp--server)))
    (and (oref server loaded) (null (oref server progress)) (null (oref server failed)))))

(defun dg-lsp-status ()
  "Show (and return) the dg-lsp state for the current buffer."
  (interactive)
  (let* ((server (dg-lsp--server))
         (text (cond ((null server) "dg-lsp: not managing this buffer")
                     ((dg-lsp--progress-text server))
                     ((oref server failed) (format "dg-lsp: model %s" (oref server failed)))
                     ((oref server loaded) "dg-lsp: ready")
                     (t "dg-lsp: starting"))))
    (when (called-interactively-p 'interactive) (message "%s" text))
    text))

(defun dg-lsp-update-settings (settings)
  "Merge the plist SETTINGS into `dg-lsp-settings' and notify running servers."
  (cl-loop for (key value) on settings by #'cddr
           do (setq dg-lsp-settings (plist-put dg-lsp-settings key value)))
  (dolist (server (and (boundp 'eglot--servers-by-project)
                       (apply #'append (hash-table-values eglot--servers-by-project))))
    (when (cl-typep server 'dg-lsp-server)
      (jsonrpc-notify server :workspace/didChangeConfiguration
                      (list :settings (list :dgLsp (dg-lsp--settings)))))))

;; Eglot's names for "ask before applying a server-initiated edit" (renamed in 1.16).
(defvar eglot-confirm-server-initiated-edits)
(defvar eglot-confirm-server-edits)

(defun dg-lsp--execute (server action)
  "Run code ACTION (a CodeAction plist) on SERVER, however this Eglot can.
The user asked for this edit, so the server's workspace/applyEdit (sent while
the command runs) is applied without Eglot's confirmation prompt.  Returns the
command's result where this Eglot gives it: (:applied BOOL :reason TEXT)."
  (let ((eglot-confirm-server-initiated-edits nil)
        (eglot-confirm-server-edits nil))
    (if (fboundp 'eglot-execute)        ; newer Eglot (Emacs 30): also resolves lazily
        (eglot-execute server action)
      (let ((edit (plist-get action :edit))
            (command (plist-get action :command)))
        (when edit (eglot--apply-workspace-edit edit))
        (when command
          (eglot-execute-command server (intern (plist-get command :command))
                                 (plist-get command :arguments)))))))

(defun dg-lsp--report (title tick result)
  "Say what running the action TITLE did; TICK is the buffer's tick before it.
The server answers an action with no infill without touching the buffer, so
without this the command would end in silence."
  (if (/= tick (buffer-chars-modified-tick))
      (message "dg-lsp: %s: done" title)
    (let ((reason (and (listp result) (plist-get result :reason))))
      (message "dg-lsp: %s: %s" title
               (cond ((not (stringp reason))
                      "no infill here (the model offered nothing that keeps the code parsing)")
                     ((string-prefix-p "no infill" reason) reason)
                     (t (format "no infill here (%s)" reason)))))))

(defun dg-lsp-code-action (which &optional beg end)
  "Run the dg-lsp code action WHICH (a key of `dg-lsp-action-titles').
BEG and END default to the region, else point.  Interactively, with WHICH
nil, choose among the actions the server offers here."
  (interactive
   (append (list nil)
           (if (use-region-p) (list (region-beginning) (region-end)) (list (point) (point)))))
  (let* ((server (or (dg-lsp--server) (user-error "dg-lsp is not managing this buffer")))
         (beg (or beg (point)))
         (end (or end beg))
         (prefix (and which (or (alist-get which dg-lsp-action-titles)
                                (user-error "Unknown dg-lsp action %s" which))))
         (actions (cl-remove-if-not
                   (lambda (a)
                     (let ((title (plist-get a :title)))
                       (if prefix (string-prefix-p prefix title)
                         (string-match-p "(dg-lsp)" title))))
                   (eglot-code-actions beg end)))
         (action (cond ((null actions)
                        (user-error "dg-lsp: no %s action here (%s)"
                                    (or which "code")
                                    (or (dg-lsp-status) "not managing this buffer")))
                       ((or prefix (null (cdr actions))) (car actions))
                       (t (let ((titles (mapcar (lambda (a) (cons (plist-get a :title) a)) actions)))
                            (cdr (assoc (completing-read "dg-lsp action: " titles nil t) titles)))))))
    (let ((tick (buffer-chars-modified-tick)))
      (dg-lsp--report (plist-get action :title) tick (dg-lsp--execute server action)))))

(defun dg-lsp-fill ()
  "Fill in code at point."
  (interactive)
  (dg-lsp-code-action 'fill (point) (point)))

(defun dg-lsp-rewrite (beg end)
  "Rewrite the region from BEG to END."
  (interactive "r")
  (dg-lsp-code-action 'rewrite beg end))

(defun dg-lsp-fill-placeholder ()
  "Fill the placeholder (TODO, pass, ...) on this line."
  (interactive)
  (dg-lsp-code-action 'placeholder (point) (point)))

(defun dg-lsp-repair ()
  "Repair the syntax error on this line."
  (interactive)
  (dg-lsp-code-action 'repair (point) (point)))

(defun dg-lsp--entry-p (entry)
  "Non-nil when ENTRY of `eglot-server-programs' is dg-lsp's."
  (or (eq (cdr entry) #'dg-lsp--contact)
      (and (consp (cdr entry)) (eq (cadr entry) 'dg-lsp-server))))

(defun dg-lsp--own-contact ()
  "What Eglot would start for this buffer without dg-lsp, when that is installed.
Nil when no other entry of `eglot-server-programs' serves the major mode or
its program is not found (Eglot's own entry for Python lists pylsp, pyright and
others, which a plain machine does not have)."
  (let* ((eglot-server-programs (cl-remove-if #'dg-lsp--entry-p eglot-server-programs))
         (found (and (fboundp 'eglot--lookup-mode) (eglot--lookup-mode major-mode)))
         ;; Eglot 1.9: (MODES LANGUAGE-ID CONTACT); newer: (((MODE . ID) ...) . CONTACT).
         (contact (if (and (consp (car found)) (consp (caar found))) (cdr found) (nth 2 found)))
         (guess (if (functionp contact) (ignore-errors (funcall contact nil)) contact))
         (program (cond ((and (consp guess) (stringp (car guess))) (car guess))
                        ((and (consp guess) (symbolp (car guess)) (stringp (cadr guess)))
                         (cadr guess)))))
    (cond ((null guess) nil)
          ((null program) guess)        ; host:port or the like: theirs, unchecked
          ((or (file-executable-p program) (executable-find program)) guess))))

(defun dg-lsp--contact (&optional _interactive)
  "The server for this buffer: dg-lsp, unless the mode's own server is installed.
With `dg-lsp-prefer', always dg-lsp."
  (or (and (not dg-lsp-prefer) (dg-lsp--own-contact))
      (cons 'dg-lsp-server dg-lsp-command)))

;;;###autoload
(defun dg-lsp-setup ()
  "Register dg-lsp in `eglot-server-programs' for `dg-lsp-modes'.
It goes first, and hands a buffer to the server Eglot would otherwise start
only when that server is installed (see `dg-lsp-prefer')."
  (interactive)
  (setq eglot-server-programs
        (cons (cons dg-lsp-modes #'dg-lsp--contact)
              (cl-remove-if #'dg-lsp--entry-p eglot-server-programs))))

(provide 'dg-lsp)
;;; dg-lsp.el ends here
