-- outbox schema, version 12: the events table refuses, at insert, a pending row the relay could
-- not publish. `{{schema}}` is the configured schema name.
--
-- A plain-SQL producer writes what it likes into `events`; before this version a row whose
-- header value was not a string (`jsonb_build_object('traceparent', NULL)` writes a JSON null),
-- whose header name was not a token, or whose content type held a control character was
-- accepted here and only failed in the relay, far from the code that wrote it. Now the
-- producer's own INSERT fails with the reason, in its own transaction.
--
-- The rules are `OutboxMessage::check_publishable`'s in outbox-core, which the relay applies to
-- every row it reads (rows older than this constraint are dead-lettered with the same reason):
--   * `aggregate_type`, `aggregate_id`, `event_type`, `destination`, `partition_key`: no control
--     character (they travel as CloudEvents attributes, which consumers refuse with one, or as
--     a subject or routing key); the lengths are the table's own checks;
--   * `headers`: a JSON object whose every value is a string without control characters, and
--     whose every name is 1..128 ASCII letters, digits, `-`, `_` or `.`, and does not start with
--     `ce-`, `ce_`, `cloudevents` or `nats-` and is not `content-type` (reserved by the
--     bindings), in any case;
--   * `content_type`: 1..255 printable ASCII characters, a media type `type/subtype` of tokens
--     before any `;` parameters;
--   * `destination`, `partition_key`: NULL, or 1..255 characters.
-- A control character is one of U+0001..U+001F and U+007F..U+009F (Rust's `char::is_control`;
-- text cannot hold U+0000).
-- The payload is not looked at (the relay does not parse payloads either).

-- What is wrong with a row's publishable columns, or NULL when nothing is.
CREATE FUNCTION {{schema}}.event_row_problem(
    aggregate_type text, aggregate_id text, event_type text, headers jsonb, content_type text,
    destination text, partition_key text
) RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    control constant text := E'[\\u0001-\\u001f\\u007f-\\u009f]';
    name  text;
    value jsonb;
    lower_name text;
BEGIN
    IF aggregate_type ~ control THEN
        RETURN 'field `aggregate_type` has a control character';
    END IF;
    IF aggregate_id ~ control THEN
        RETURN 'field `aggregate_id` has a control character';
    END IF;
    IF event_type ~ control THEN
        RETURN 'field `event_type` has a control character';
    END IF;
    IF destination ~ control THEN
        RETURN 'field `destination` has a control character';
    END IF;
    IF partition_key ~ control THEN
        RETURN 'field `partition_key` has a control character';
    END IF;
    IF jsonb_typeof(headers) IS DISTINCT FROM 'object' THEN
        RETURN format('column `headers` is %s, not an object of strings',
                      coalesce(jsonb_typeof(headers), 'NULL'));
    END IF;
    FOR name, value IN SELECT e.key, e.value FROM jsonb_each(headers) AS e LOOP
        IF jsonb_typeof(value) <> 'string' THEN
            RETURN format('header `%s` is %s: every header value must be a string', name,
                          CASE jsonb_typeof(value)
                              WHEN 'null' THEN 'null' WHEN 'number' THEN 'a number'
                              WHEN 'boolean' THEN 'a boolean' WHEN 'array' THEN 'an array'
                              ELSE 'an object' END);
        END IF;
        lower_name := lower(name);
        IF name !~ '^[A-Za-z0-9._-]{1,128}$' OR lower_name LIKE 'ce-%' OR lower_name LIKE E'ce\\_%'
           OR lower_name LIKE 'cloudevents%' OR lower_name LIKE 'nats-%'
           OR lower_name = 'content-type' THEN
            RETURN format('header name `%s` is invalid: use 1..=128 ASCII letters, digits or -_. '
                          'and no `ce-`/`ce_` prefix', name);
        END IF;
        IF (value #>> '{}') ~ control THEN
            RETURN format('header `%s` has a control character in its value', name);
        END IF;
    END LOOP;
    IF length(content_type) NOT BETWEEN 1 AND 255 THEN
        RETURN format('field `content_type` must be 1..=255 characters, got %s',
                      coalesce(length(content_type), 0));
    END IF;
    IF content_type !~ '^[ -~]*$' THEN
        RETURN 'content type is invalid: only printable ASCII is allowed (no control or '
               'non-ASCII characters)';
    END IF;
    IF content_type !~ '^ *[-!#$%&''*+.^_`|~0-9A-Za-z]+/[-!#$%&''*+.^_`|~0-9A-Za-z]+ *(;.*)?$' THEN
        RETURN 'content type is invalid: must be a media type `type/subtype`, e.g. '
               '`application/json`';
    END IF;
    IF destination IS NOT NULL AND length(destination) NOT BETWEEN 1 AND 255 THEN
        RETURN format('field `destination` must be 1..=255 characters, got %s', length(destination));
    END IF;
    IF partition_key IS NOT NULL AND length(partition_key) NOT BETWEEN 1 AND 255 THEN
        RETURN format('field `partition_key` must be 1..=255 characters, got %s',
                      length(partition_key));
    END IF;
    RETURN NULL;
END
$$;

-- The constraint's check: true, or an error whose message is the problem (a plain CHECK could
-- only name itself).
--
-- It runs on every producer insert, so it first tries a fast test that is sufficient, never
-- necessary: printable ASCII in the key fields, a usual content type, and headers whose JSON
-- text is short (so no name can pass 128 characters), of plain ASCII names and values without a
-- quote, a backslash or a control character, and no reserved name. A row it accepts breaks no
-- rule; any other row (non-ASCII text, long or escaped headers, another media type) is judged
-- by event_row_problem, which is the rule. Measured on an insert with one `traceparent` header,
-- in the server's CPU per insert: about 15 us with the fast test, about 45 us without it
-- (BENCHMARKS.md, "Issue 31").
CREATE FUNCTION {{schema}}.event_row_publishable(
    aggregate_type text, aggregate_id text, event_type text, headers jsonb, content_type text,
    destination text, partition_key text
) RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    problem text;
    t text;
BEGIN
    IF (aggregate_type || aggregate_id || event_type || coalesce(destination, '') ||
        coalesce(partition_key, '')) ~ '^[ -~]*$'
       AND (destination IS NULL OR length(destination) BETWEEN 1 AND 255)
       AND (partition_key IS NULL OR length(partition_key) BETWEEN 1 AND 255)
       AND content_type IN ('application/json', 'application/octet-stream',
                            'text/plain; charset=utf-8') THEN
        IF headers = '{}'::jsonb THEN
            RETURN true;
        END IF;
        t := lower(headers::text);
        IF octet_length(t) <= 130
           AND t ~ E'^\\{"[a-z0-9._-]+": "[ !#-\\[\\]-~]*"(, "[a-z0-9._-]+": "[ !#-\\[\\]-~]*")*\\}$'
           AND strpos(t, '"ce-') = 0 AND strpos(t, '"ce_') = 0 AND strpos(t, '"cloudevents') = 0
           AND strpos(t, '"nats-') = 0 AND strpos(t, '"content-type"') = 0 THEN
            RETURN true;
        END IF;
    END IF;
    problem := {{schema}}.event_row_problem(aggregate_type, aggregate_id, event_type, headers,
                                            content_type, destination, partition_key);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: this event cannot be published: %', problem
            USING ERRCODE = 'check_violation',
                  HINT = 'Every header value must be a string (write '''' or leave the header '
                         'out instead of null); see "the SQL contract" in the guide.';
    END IF;
    RETURN true;
END
$$;

-- Pending rows only: a dead letter or a published row may hold anything (that is where the
-- relay puts a row it could not publish), and a requeue of one that is still wrong fails with
-- the reason. NOT VALID: added without reading the table (no long lock on a live outbox), it
-- holds for every row written from now on; `outbox migrate` reports pending rows written
-- before it that break it (the relay dead-letters them with the same reason).
ALTER TABLE {{schema}}.events ADD CONSTRAINT events_publishable CHECK (
    CASE WHEN state = 'pending'
         THEN {{schema}}.event_row_publishable(aggregate_type, aggregate_id, event_type, headers,
                                               content_type, destination, partition_key)
         ELSE true END
) NOT VALID;
