-- 0018: "is Linear told about this org" as a function the planner inlines.
--
-- `devpilot_notifies(org)` (0003) is a scalar SQL function whose body is a sub-select, and Postgres
-- never inlines a scalar function with a sub-select in it: every row a statement tests ran the
-- function on its own (the ack's notices tested each delivered start's org, ten calls for a batch
-- of ten, about a sixth of the ack's execution). A set-returning SQL function with one SELECT is
-- inlined where it is called in FROM, so `EXISTS (SELECT FROM devpilot_notified(org))` plans as an
-- index probe of `linear_credentials` within the statement. The rule itself is unchanged and still
-- written once: only orgs that gave us a Linear token are told (without one there is nothing to
-- post with, so no notice row is written).

-- The org, if Linear is told about it (one row), else no row.
CREATE OR REPLACE FUNCTION devpilot_notified(org text) RETURNS SETOF text
LANGUAGE sql STABLE
AS $$ SELECT c.org_id FROM linear_credentials c WHERE c.org_id = org $$;

-- Kept, in terms of the rule above, for a release whose statements still call it while this
-- migration rolls out; this release's statements call `devpilot_notified`. (A SQL function's body
-- records no dependency: the migration that retires this one drops it before `devpilot_notified`,
-- or a drop of that would leave this one failing at its next call.)
CREATE OR REPLACE FUNCTION devpilot_notifies(org text) RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT EXISTS (SELECT FROM devpilot_notified(org)) $$;
