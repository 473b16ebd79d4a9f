-- outbox schema, version 4: a consumer dead letter keeps the message byte for byte, and what the
-- broker said about it. `{{schema}}` is the configured schema name.
--
-- A dead letter is written for messages the consumer could not record, so nothing in it may be
-- refused: text columns cannot hold NUL and jsonb cannot hold \u0000, hence bytes. The older
-- `content_type` and `headers` columns stay as a readable view (NUL shown as U+FFFD); rows
-- written before this version have NULL in the new byte columns.
ALTER TABLE {{schema}}.consumer_dead_letters
    -- Every header as received, names and values in two arrays of the same length; a value
    -- that is valid UTF-8 is text, any other one binary (an AMQP long string or byte array).
    ADD COLUMN header_names       bytea[],
    ADD COLUMN header_values      bytea[],
    ADD COLUMN content_type_bytes bytea,
    -- The broker's view of the delivery (NATS subject, stream and sequences; RabbitMQ exchange,
    -- routing key and message properties), for the operator; never decoded.
    ADD COLUMN broker_metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD CONSTRAINT consumer_dead_letters_headers_paired
        CHECK (cardinality(header_names) = cardinality(header_values));
