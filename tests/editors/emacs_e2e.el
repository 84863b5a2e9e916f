;;; emacs_e2e.el --- drive editors/emacs/dg-lsp.el in batch Emacs  -*- lexical-binding: t; -*-

;; Run by tests/editors/test_editor_emacs.py: loads dg-lsp.el as a user would, opens a file, waits for
;; the model-loading progress to end, completes at point with `completion-at-point' and runs the
;; "Fill in here" code action.  Prints one line "DG-RESULT <json>" for the test to check.

(require 'json)

(defun dg-test--env-json (name)
  (json-parse-string (getenv name) :object-type 'plist :array-type 'array))

(defun dg-test--wait (pred seconds what)
  "Pump process output until PRED is non-nil or SECONDS pass."
  (let ((deadline (+ (float-time) seconds)))
    (while (and (not (funcall pred)) (< (float-time) deadline))
      (accept-process-output nil 0.2))
    (or (funcall pred) (error "Timed out after %ss waiting for %s" seconds what))))

(add-to-list 'load-path (getenv "DG_TEST_EMACS_DIR"))
(require 'dg-lsp)
(setq dg-lsp-command (append (dg-test--env-json "DG_TEST_SERVER_CMD") nil))
(setq dg-lsp-settings (dg-test--env-json "DG_TEST_SETTINGS"))
(dg-lsp-setup)
(setq eglot-sync-connect 30)

(defun dg-test--dump-server-stderr ()
  "Print the server's stderr (Eglot keeps it in a buffer) to help explain a failure."
  (dolist (buf (buffer-list))
    (when (string-match-p "EGLOT.*stderr" (buffer-name buf))
      (with-current-buffer buf
        (princ (format "--- %s ---\n%s\n" (buffer-name buf) (buffer-string)))))))

(condition-case err
(let ((result (list :emacs emacs-version
                    :eglot (ignore-errors
                             (with-temp-buffer
                               (insert-file-contents (locate-library "eglot.el"))
                               (require 'lisp-mnt)
                               (lm-version))))))
  (find-file (getenv "DG_TEST_FILE"))
  (defvar dg-test-original (buffer-string))
  (eglot-ensure)
  (run-hooks 'post-command-hook)        ; eglot-ensure connects after the next command
  (dg-test--wait #'dg-lsp--server 60 "eglot to connect dg-lsp")
  (dg-test--wait #'dg-lsp-ready-p 180 "the model-loading progress to end")
  (setq result (plist-put result :ready t))
  (setq result (plist-put result :status (dg-lsp-status)))
  (setq result (plist-put result :language (eglot--language-id (eglot-current-server))))

  ;; Completion fallback: what the server offers here, then what completion-at-point inserts.
  (goto-char (point-min))
  (end-of-line)
  (let* ((capf (eglot-completion-at-point))
         (labels (all-completions "" (nth 2 capf)))
         (item (and labels (get-text-property 0 'eglot--lsp-item (car labels)))))
    (setq result (plist-put result :before dg-test-original))
    (setq result (plist-put result :offered (length labels)))
    (setq result (plist-put result :expected
                            (and item (plist-get (plist-get item :textEdit) :newText))))
    (completion-at-point)
    (setq result (plist-put result :after_completion (buffer-string))))

  ;; Code action: restore the text, then "Fill in here (dg-lsp)" at the end of line 1.
  (erase-buffer)
  (insert dg-test-original)
  (goto-char (point-min))
  (end-of-line)
  (let ((tick (buffer-modified-tick)))
    (dg-lsp-fill)
    (dg-test--wait (lambda () (/= tick (buffer-modified-tick))) 90 "the code action's edit")
    (setq result (plist-put result :after_action (buffer-string))))

  (dg-lsp-update-settings '(:maxTokens 4))
  (setq result (plist-put result :settings dg-lsp-settings))
  (princ (format "DG-RESULT %s\n" (json-encode result)))
  (eglot-shutdown (eglot-current-server))
  (kill-emacs 0))
  (error
   (dg-test--dump-server-stderr)
   (princ (format "DG-ERROR %S\n" err))
   (kill-emacs 1)))
