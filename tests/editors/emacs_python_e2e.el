;;; emacs_python_e2e.el --- the README snippet in a Python buffer, batch Emacs  -*- lexical-binding: t; -*-

;; Run by tests/editors/test_editor_emacs.py.  Loads dg-lsp.el with the editors/emacs/README.md
;; snippet as written (only `dg-lsp-command' and the settings come from the test), opens a .py file
;; on a machine without pylsp or pyright, and checks that Eglot picks dg-lsp without
;; `dg-lsp-prefer'.  The model is a missing directory, so `dg-lsp-fill' finds no infill: it must say
;; so.  Prints one line "DG-RESULT <json>".

(require 'json)

(defvar dg-test-said nil "Every message shown, newest first.")
(advice-add 'message :around
            (lambda (f &rest args)
              (let ((said (apply f args)))
                (push said dg-test-said)
                said)))

(defun dg-test--wait (pred seconds what)
  (let ((deadline (+ (float-time) seconds)))
    (while (and (not (funcall pred)) (< (float-time) deadline))
      (accept-process-output nil 0.2))
    (or (funcall pred) (error "Timed out after %ss waiting for %s" seconds what))))

;; The README snippet, as written.
(add-to-list 'load-path (getenv "DG_TEST_EMACS_DIR"))
(require 'dg-lsp)
(setq dg-lsp-settings '(:maxTokens 32))
(dg-lsp-setup)
(add-hook 'prog-mode-hook #'eglot-ensure)
(add-hook 'text-mode-hook #'eglot-ensure)
(define-key eglot-mode-map (kbd "C-c f") #'dg-lsp-fill)
;; The test's server and model.
(setq dg-lsp-command (append (json-parse-string (getenv "DG_TEST_SERVER_CMD") :array-type 'array) nil))
(setq dg-lsp-settings (json-parse-string (getenv "DG_TEST_SETTINGS") :object-type 'plist))
(setq eglot-sync-connect 30)

(condition-case err
    (let (result)
      (find-file (getenv "DG_TEST_FILE"))
      (run-hooks 'post-command-hook)    ; eglot-ensure connects after the next command
      (dg-test--wait #'dg-lsp--server 60 "eglot to connect dg-lsp")
      (dg-test--wait (lambda () (oref (dg-lsp--server) loaded)) 180 "the model load to end")
      (setq result (list :mode (symbol-name major-mode)
                         :prefer dg-lsp-prefer
                         :server (symbol-name (eieio-object-class-name (eglot-current-server)))
                         :language (eglot--language-id (eglot-current-server))
                         :status (dg-lsp-status)
                         :ready (if (dg-lsp-ready-p) t :json-false)))
      (goto-char (point-max))
      (let ((before (buffer-string)))
        (setq dg-test-said nil)
        (condition-case e (call-interactively #'dg-lsp-fill)
          (user-error (push (error-message-string e) dg-test-said)))
        (setq result (plist-put result :fill_said (car (delq nil dg-test-said))))
        (setq result (plist-put result :unchanged (if (equal before (buffer-string)) t :json-false))))
      (princ (format "DG-RESULT %s\n" (json-encode result)))
      (eglot-shutdown (eglot-current-server))
      (kill-emacs 0))
  (error
   (princ (format "DG-ERROR %S\n" err))
   (kill-emacs 1)))
