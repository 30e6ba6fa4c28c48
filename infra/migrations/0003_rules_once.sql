-- 0003: two rules that several statements apply, written once, in the database.

-- The retry rule of the product, for deliveries and Linear notices alike: after the n-th failed
-- attempt, wait min(n² × base, cap) seconds. bigint inside, so a large n cannot overflow.
-- IMMUTABLE and plain SQL, so the planner inlines it into each statement that calls it.
CREATE OR REPLACE FUNCTION devpilot_backoff(n integer, base integer, cap integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT least(n::bigint * n * base, cap)::integer $$;

-- Whether Linear is told about an org's state changes: only orgs that gave us a Linear token;
-- without one there is nothing to post with, so no notice row is written.
CREATE OR REPLACE FUNCTION devpilot_notifies(org text) RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT EXISTS (SELECT 1 FROM linear_credentials c WHERE c.org_id = org) $$;
