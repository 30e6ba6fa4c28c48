-- Supabase only: run at the end of EVERY `devpilot migrate` where Supabase's schemas exist (not a
-- numbered migration, so it also covers tables that later migrations add).
--
-- Supabase grants every table in `public` to its `anon` and `authenticated` roles by default, and
-- serves them over its REST API to anyone holding the project's anon key; a machine's Realtime
-- token (from /realtime-token) is an `authenticated` JWT. So here: every table in `public` that the
-- migrating role owns (all of devpilot's; give devpilot its own project or database) gets row-level
-- security, those roles lose every privilege on those tables, their sequences and devpilot's
-- functions, and get back exactly one: SELECT on dispatch_queue, filtered by the orchestrator_sees_own_rows policy
-- (supabase/0001) to the caller's own rows — what Realtime needs to tell a machine "look now".
-- The service connects as the tables' owner, which row-level security does not restrict.
DO $$
DECLARE
    obj record;
    client text;
BEGIN
    FOR obj IN
        SELECT c.oid::regclass AS name, c.relkind FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'S')
          AND pg_get_userbyid(c.relowner) = current_user
    LOOP
        IF obj.relkind <> 'S' THEN
            EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', obj.name);
        END IF;
        FOR client IN SELECT rolname FROM pg_roles WHERE rolname IN ('anon', 'authenticated') LOOP
            EXECUTE format('REVOKE ALL ON %s FROM %I', obj.name, client);
        END LOOP;
    END LOOP;
    -- Functions are executable by PUBLIC (every role) unless revoked, and Supabase's default
    -- privileges also grant each new one to the client roles by name: both go. devpilot's
    -- functions are the service's.
    FOR obj IN
        SELECT p.oid::regprocedure AS name, 'f' AS relkind FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'devpilot\_%'
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', obj.name);
        FOR client IN SELECT rolname FROM pg_roles WHERE rolname IN ('anon', 'authenticated') LOOP
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %I', obj.name, client);
        END LOOP;
    END LOOP;
    -- Tables and functions this role makes later are not granted to the client roles by default either.
    FOR client IN SELECT rolname FROM pg_roles WHERE rolname IN ('anon', 'authenticated') LOOP
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON TABLES FROM %I', client);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON SEQUENCES FROM %I', client);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON FUNCTIONS FROM %I', client);
    END LOOP;
END
$$;

GRANT SELECT ON public.dispatch_queue TO authenticated;
