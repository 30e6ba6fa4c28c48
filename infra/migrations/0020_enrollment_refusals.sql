-- 0020: a sign-in the service refuses ends its enrollment, and says why to the machine waiting.
--
-- Linear said who signed in, and they may not connect a machine (the workspace has not installed
-- the app, a guest, a deactivated account, an app user), or Linear itself refused the sign-in: the
-- enrollment is `denied` and `refusal` keeps the reason, which `POST /enroll/token` answers
-- (`400 access_denied`) to a `login --no-browser` polling for it; a loopback login hears it at once
-- through its redirect (RFC 6749 §4.1.2.1). NULL for a Deny pressed on the confirm page.
ALTER TABLE enrollments ADD COLUMN IF NOT EXISTS refusal text;
