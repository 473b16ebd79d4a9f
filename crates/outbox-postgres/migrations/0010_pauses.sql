-- outbox schema, version 10: routes and consumers an operator paused. `{{schema}}` is the
-- configured schema name.
--
-- A paused route (`kind = 'route'`, `name` as in `activity`: `destination:` and the row's
-- destination, or `type:` and its aggregate type when it has none) is not claimed by the
-- polling relay: its rows stay pending, and an aggregate whose next row goes to a paused route
-- waits there, its later rows too (per-aggregate order). A paused consumer (`kind =
-- 'consumer'`, `name` the consumer's name) takes no deliveries from its source until resumed;
-- what the broker holds for it stays there. Written by `Admin::pause` and `Admin::resume` in
-- the transaction of their audit record (`audit_id`).
CREATE TABLE {{schema}}.pauses (
    kind      text        NOT NULL CHECK (kind IN ('route', 'consumer')),
    name      text        NOT NULL CHECK (length(name) BETWEEN 1 AND 1024),
    paused_at timestamptz NOT NULL DEFAULT now(),
    audit_id  bigint      NOT NULL,
    PRIMARY KEY (kind, name)
);
