-- People connect their own machines (/enroll) and see them (/me). Codes, states, cookies and tokens
-- are looked up by their SHA-256 only: a lookup by hash is no timing oracle on the secret.

-- name: rate_hit
-- One more hit of a public route by one client (a key such as 'enroll:<address>'): counted in the
-- current window, or the first of a new one. Returns the hits of the window so far, this one included.
INSERT INTO rate_limits (key, hits, window_start) VALUES (%(key)s, 1, now())
ON CONFLICT (key) DO UPDATE SET
    hits = CASE WHEN rate_limits.window_start > now() - make_interval(secs => %(window)s)
                THEN rate_limits.hits + 1 ELSE 1 END,
    window_start = CASE WHEN rate_limits.window_start > now() - make_interval(secs => %(window)s)
                        THEN rate_limits.window_start ELSE now() END
RETURNING hits;

-- name: rate_hits
-- The hits of the current window, without adding one (0 rows: none).
SELECT hits FROM rate_limits
WHERE key = %(key)s AND window_start > now() - make_interval(secs => %(window)s);

-- name: enrollment_create
-- A machine asks to be enrolled. A code-mode enrollment's code is unique among the live ones: a
-- clash (one in 2.5e10 per live code) returns no row and the caller draws another code.
INSERT INTO enrollments (mode, name, code_challenge, loopback_port, user_code_hash, requested_from, expires_at)
VALUES (%(mode)s, %(name)s, %(code_challenge)s, %(loopback_port)s, %(user_code_hash)s, %(requested_from)s,
        now() + make_interval(secs => %(seconds)s))
ON CONFLICT (user_code_hash) DO NOTHING
RETURNING id;

-- name: flow_start_enrollment
-- A browser opens a loopback enrollment's start link: a new sign-in flow bound to that browser,
-- only while nobody has signed in for the enrollment and it has not expired. A later start (another
-- tab, the link opened again after a refusal) is a flow of its own; each state is good once.
INSERT INTO signin_flows (state_hash, browser_hash, purpose, enrollment_id, expires_at)
SELECT %(state_hash)s, %(browser_hash)s, 'enroll', e.id, e.expires_at
FROM enrollments e
WHERE e.id = %(enrollment_id)s AND e.mode = 'loopback' AND e.status = 'pending' AND e.expires_at > now()
RETURNING enrollment_id;

-- name: flow_start_code
-- A browser enters a code: a new sign-in flow for the code-mode enrollment it names, while it is
-- live and not yet confirmed (entering it again after closing the confirm page starts over).
INSERT INTO signin_flows (state_hash, browser_hash, purpose, enrollment_id, expires_at)
SELECT %(state_hash)s, %(browser_hash)s, 'enroll', e.id, e.expires_at
FROM enrollments e
WHERE e.user_code_hash = %(code_hash)s AND e.status IN ('pending', 'signed_in') AND e.expires_at > now()
RETURNING enrollment_id;

-- name: flow_start_me
-- A browser signs in to /me: a flow of its own, good for 10 minutes.
INSERT INTO signin_flows (state_hash, browser_hash, purpose, expires_at)
VALUES (%(state_hash)s, %(browser_hash)s, 'me', now() + make_interval(secs => %(seconds)s))
RETURNING purpose;

-- name: flow_take
-- The callback: the flow its state names, used up, but only in the browser that started it (the
-- same cookie) and while it is live. A state from elsewhere uses nothing up.
DELETE FROM signin_flows
WHERE state_hash = %(state_hash)s AND browser_hash = %(browser_hash)s AND expires_at > now()
RETURNING purpose, enrollment_id;

-- name: flow_known
-- Why a state was refused: a live flow of another browser, or nothing live at all.
SELECT 1 AS other_browser FROM signin_flows WHERE state_hash = %(state_hash)s AND expires_at > now();

-- name: enrollment_signed_in
-- Linear said who signed in, and they may: the enrollment takes their workspace and user, the
-- browser, and (loopback) the one-time code's hash, valid for `grant_seconds`, or (code mode) the
-- confirm page's CSRF token's hash. A loopback enrollment is signed in once; a code-mode one may be
-- signed in again until it is confirmed (the latest sign-in is the one confirmed).
UPDATE enrollments
SET status = 'signed_in', org_id = %(org_id)s, linear_user_id = %(linear_user_id)s,
    browser_hash = %(browser_hash)s,
    grant_hash = CASE WHEN mode = 'loopback' THEN %(grant_hash)s END,
    grant_expires_at = CASE WHEN mode = 'loopback' THEN now() + make_interval(secs => %(grant_seconds)s) END,
    confirm_hash = CASE WHEN mode = 'code' THEN %(confirm_hash)s END
WHERE id = %(id)s AND expires_at > now() AND (status = 'pending' OR (mode = 'code' AND status = 'signed_in'))
RETURNING mode, name, loopback_port, requested_from, created_at;

-- name: enrollment_decide
-- Code mode, the confirm page's Register or Deny: only from the browser that signed in, with the
-- page's CSRF token, once, while the enrollment is live.
UPDATE enrollments SET status = CASE WHEN %(approve)s THEN 'approved' ELSE 'denied' END
WHERE id = %(id)s AND mode = 'code' AND status = 'signed_in' AND expires_at > now()
  AND browser_hash = %(browser_hash)s AND confirm_hash = %(confirm_hash)s
RETURNING status, name, org_id;

-- name: enrollment_refuse
-- Linear said who signed in and they may not connect a machine, or Linear refused the sign-in: the
-- live enrollment is refused for good, with the reason its machine hears (`refusal`), once. No row:
-- it had ended already (redeemed, spent, denied or expired), and nothing changes.
UPDATE enrollments SET status = 'denied', refusal = %(refusal)s, grant_hash = NULL, confirm_hash = NULL
WHERE id = %(id)s AND expires_at > now() AND status IN ('pending', 'signed_in')
RETURNING mode, loopback_port;

-- name: enrollment_lock
-- The machine redeems its enrollment: the row, locked for the rest of the transaction, so two
-- redemptions at once take turns and the second finds it redeemed.
SELECT id, mode, name, code_challenge, status, refusal, org_id, linear_user_id, grant_hash,
       grant_expires_at > now() AS grant_live, expires_at <= now() AS expired
FROM enrollments WHERE id = %(id)s
FOR UPDATE;

-- name: enrollment_spend
-- A wrong verifier, or a wrong, used or late code: the enrollment is refused for good.
UPDATE enrollments SET status = 'spent', grant_hash = NULL, confirm_hash = NULL WHERE id = %(id)s;

-- name: enrollment_redeemed
-- In the transaction that registered the machine: the enrollment is done; nothing can redeem it again.
UPDATE enrollments SET status = 'redeemed', orchestrator_id = %(orchestrator_id)s, grant_hash = NULL,
                       confirm_hash = NULL
WHERE id = %(id)s;

-- name: person_seen
-- The names Linear gave at a sign-in, kept for `whoami` and /me.
INSERT INTO linear_people (org_id, linear_user_id, name, workspace_name)
VALUES (%(org_id)s, %(linear_user_id)s, %(name)s, %(workspace_name)s)
ON CONFLICT (org_id, linear_user_id) DO UPDATE
SET name = excluded.name, workspace_name = excluded.workspace_name, updated_at = now();

-- name: person_names
SELECT name, workspace_name FROM linear_people WHERE org_id = %(org_id)s AND linear_user_id = %(linear_user_id)s;

-- name: org_connected
-- The workspace has installed the app (a Linear connection that is not disconnected).
SELECT org_id FROM linear_credentials WHERE org_id = %(org_id)s AND disconnected_at IS NULL;

-- name: people_session_create
-- A person signed in on /me: a new random session (only its hash here); expired ones cleared on the way.
WITH gone AS (DELETE FROM people_sessions WHERE expires_at < now())
INSERT INTO people_sessions (token_hash, org_id, linear_user_id, expires_at)
VALUES (%(token_hash)s, %(org_id)s, %(linear_user_id)s, now() + make_interval(secs => %(seconds)s));

-- name: people_session_get
-- Who holds this /me session, with the names Linear gave.
SELECT s.org_id, s.linear_user_id, p.name, p.workspace_name
FROM people_sessions s
LEFT JOIN linear_people p ON p.org_id = s.org_id AND p.linear_user_id = s.linear_user_id
WHERE s.token_hash = %(token_hash)s AND s.expires_at > now();

-- name: people_session_end
DELETE FROM people_sessions WHERE token_hash = %(token_hash)s;

-- name: person_machines
-- One person's active machines, most recently seen first: whether a long-poll of it is waiting
-- now (listening) or it only polls, what is queued for it (the first issues, in queue order), and
-- what it said it has (its repositories and labels, `POST /machine`, and when: NULL, never).
SELECT o.id, o.name, o.created_at, o.last_seen_at, i.updated_at AS described_at,
       coalesce(o.listening_until > now(), false) AS listening,
       count(q.id) AS queued,
       (array_agg(coalesce(s.issue_identifier, s.issue_id) ORDER BY q.seq)
            FILTER (WHERE q.id IS NOT NULL))[1:10] AS issues,
       coalesce(i.repositories, '[]') AS repositories, coalesce(i.labels, '{}') AS labels
FROM orchestrators o
LEFT JOIN machine_inventories i ON i.orchestrator_id = o.id
LEFT JOIN dispatch_queue q ON q.orchestrator_id = o.id
LEFT JOIN dispatch_sessions s ON s.id = q.session_id
WHERE o.org_id = %(org_id)s AND o.linear_user_id = %(linear_user_id)s AND o.revoked_at IS NULL
GROUP BY o.id, i.orchestrator_id
ORDER BY o.last_seen_at DESC NULLS LAST, o.created_at DESC, o.id;

-- name: person_owns
-- The machine is this person's (revoked or not): anyone else's is not found.
SELECT id FROM orchestrators
WHERE id = %(id)s AND org_id = %(org_id)s AND linear_user_id = %(linear_user_id)s;

-- name: signin_forget
-- The sweep: enrollments and sign-in flows `after` seconds past their expiry (never finished, or
-- finished and of no more use), ended /me sessions, and rate-limit windows long over.
WITH flows AS (
    DELETE FROM signin_flows WHERE expires_at < now() - make_interval(secs => %(after)s) RETURNING 1
), enrolled AS (
    DELETE FROM enrollments WHERE expires_at < now() - make_interval(secs => %(after)s) RETURNING 1
), sessions AS (
    DELETE FROM people_sessions WHERE expires_at < now() RETURNING 1
), limits AS (
    DELETE FROM rate_limits WHERE window_start < now() - make_interval(secs => %(after)s) RETURNING 1
)
SELECT (SELECT count(*) FROM enrolled) AS enrollments, (SELECT count(*) FROM flows) AS flows,
       (SELECT count(*) FROM sessions) AS sessions, (SELECT count(*) FROM limits) AS limits;
