-- Every change to a key is announced on the channel inferrail_keys, its
-- payload the key's id, when the change commits, whoever makes it (a
-- gateway's admin API, or SQL by hand): gateways that LISTEN drop their
-- cached copy at once instead of within auth_cache_ttl.
CREATE OR REPLACE FUNCTION inferrail_key_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('inferrail_keys', OLD.id);
    ELSE
        PERFORM pg_notify('inferrail_keys', NEW.id);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER api_keys_notify AFTER INSERT OR UPDATE OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION inferrail_key_changed();
