-- outbox schema, version 5: the producer's delete-in-transaction option, for the CDC relay
-- (PgOutbox::delete_in_transaction). `{{schema}}` is the configured schema name.
--
-- Inserts the rows and deletes them again, in the caller's transaction and in one round trip:
-- the log keeps the inserts, which the CDC relay streams and publishes, and the table stays
-- empty. The arrays are the columns of INSERT_EVENTS, one element per event, in order.
-- SECURITY INVOKER: the caller needs INSERT on the producer columns, as for any enqueue, and
-- also DELETE and SELECT (event_id) on events, which the roles of `outbox roles` do not grant.
CREATE FUNCTION {{schema}}.enqueue_deleted(
    event_ids          uuid[],
    aggregate_types    text[],
    aggregate_ids      text[],
    aggregate_versions int8[],
    event_types        text[],
    schema_versions    int4[],
    content_types      text[],
    payloads           bytea[],
    headers            text[],
    destinations       text[],
    partition_keys     text[]
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
BEGIN
    -- PL/pgSQL keeps both plans for the session; a LANGUAGE sql function plans them on
    -- every call.
    INSERT INTO {{schema}}.events (event_id, aggregate_type, aggregate_id, aggregate_version,
        event_type, schema_version, content_type, payload, headers, destination, partition_key)
    SELECT u.event_id, u.aggregate_type, u.aggregate_id, u.aggregate_version, u.event_type,
        u.schema_version, u.content_type, u.payload, u.headers::jsonb, u.destination,
        u.partition_key
    FROM unnest(event_ids, aggregate_types, aggregate_ids, aggregate_versions, event_types,
        schema_versions, content_types, payloads, headers, destinations, partition_keys)
        WITH ORDINALITY AS u(event_id, aggregate_type, aggregate_id, aggregate_version,
        event_type, schema_version, content_type, payload, headers, destination, partition_key,
        ord)
    ORDER BY u.ord;
    DELETE FROM {{schema}}.events WHERE event_id = ANY(event_ids);
END
$$;
