-- 0003: API keys and namespaces. A key is stored only as the SHA-256 of its token (the token is
-- shown once, at creation, and is high-entropy, so an unsalted hash cannot be reversed). A revoked
-- key keeps its row: auth stays on once any key was ever created, so revoking the last key cannot
-- open the API by accident.
CREATE TABLE api_keys (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_sha256         bytea       NOT NULL UNIQUE,
    name                 text        NOT NULL DEFAULT '',
    scope                text        NOT NULL,
    namespace            text,                            -- NULL: the default namespace
    routing_key_prefixes text[]      NOT NULL DEFAULT '{}', -- empty: any routing key
    created_at           timestamptz NOT NULL DEFAULT now(),
    revoked_at           timestamptz,
    CONSTRAINT api_keys_scope_known CHECK (scope IN ('producer', 'monitor', 'admin'))
);

-- The namespace a job was submitted in (NULL: the default one). Adding a nullable column without a
-- default rewrites nothing.
ALTER TABLE jobs ADD COLUMN namespace text;

-- Idempotency keys are unique per namespace, so reusing another namespace's key finds nothing of
-- it. coalesce() folds the default namespace into '' (a key's namespace is never empty).
DROP INDEX jobs_idempotency_key;
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs ((coalesce(namespace, '')), idempotency_key)
    WHERE idempotency_key IS NOT NULL;
