-- +goose Up
-- An administrator can be disabled (someone who left, a credential that
-- may have leaked) without losing the history that names them: a disabled
-- administrator cannot sign in, their console sessions are ended and their
-- API tokens are refused until they are enabled again. NULL: enabled.
-- password_changed_at says when the password was last set, so the console
-- can show how old a password is (NULL: set when the account was created).
ALTER TABLE admin_users ADD COLUMN disabled_at DATETIME;
ALTER TABLE admin_users ADD COLUMN password_changed_at DATETIME;

-- +goose Down
ALTER TABLE admin_users DROP COLUMN password_changed_at;
ALTER TABLE admin_users DROP COLUMN disabled_at;
