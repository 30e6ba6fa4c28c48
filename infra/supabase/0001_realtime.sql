-- Supabase only (applied by `devpilot migrate` where the `realtime` schema and the `authenticated`
-- role exist): lets Supabase Realtime tell an orchestrator that a row of its own was inserted.
-- Row-level security is what keeps orgs apart on the socket: a Realtime token minted by
-- /realtime-token carries `orchestrator_id`, and this policy shows that orchestrator its rows only.
-- The service itself connects as the table owner and is not subject to the policy.

ALTER TABLE dispatch_queue ENABLE ROW LEVEL SECURITY;

DROP POLICY IF EXISTS orchestrator_sees_own_rows ON dispatch_queue;
CREATE POLICY orchestrator_sees_own_rows ON dispatch_queue
    FOR SELECT TO authenticated
    USING (orchestrator_id::text = (current_setting('request.jwt.claims', true)::jsonb ->> 'orchestrator_id'));

GRANT SELECT ON dispatch_queue TO authenticated;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'supabase_realtime') THEN
        CREATE PUBLICATION supabase_realtime;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_publication_tables
        WHERE pubname = 'supabase_realtime' AND schemaname = 'public' AND tablename = 'dispatch_queue'
    ) THEN
        ALTER PUBLICATION supabase_realtime ADD TABLE public.dispatch_queue;
    END IF;
END
$$;
