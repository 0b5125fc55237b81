"""Intake: storing new jobs (one statement per batch) and finding them by id or idempotency key."""

from typing import Final

# The columns intake writes, each with the type its parameter is cast to, in the order of the
# contract functions' arrays (sql/0012, 0024). ENQUEUE_JOBS and INSERT_JOB are built from it once,
# here (no value is ever formatted into them), and ``store.jobs`` builds their parameters from it.
INSERTED_COLUMNS: Final = (
    ("id", "uuid"),
    ("shard", "int"),
    ("routing_key", "text"),
    ("payload", "bytea"),
    ("headers", "jsonb"),  # JSON text
    ("priority", "smallint"),
    ("ttl_ms", "bigint"),
    ("idempotency_key", "text"),
    ("run_at", "timestamptz"),
    ("namespace", "text"),  # NULL: the default namespace
)

_INSERTED_NAMES = [name for name, _ in INSERTED_COLUMNS]

_INSERTED_PARAMETERS = [
    f"${number}::{sql_type}" for number, (_, sql_type) in enumerate(INSERTED_COLUMNS, 1)
]

# The contract function takes the id hashes right after the shards: NULL, as the dispatcher
# chooses every shard itself.
_ENQUEUE_ARRAYS = [f"{parameter}[]" for parameter in _INSERTED_PARAMETERS]
_ENQUEUE_ARRAYS.insert(_INSERTED_NAMES.index("shard") + 1, "NULL")

# One job that asks nothing of its key but to keep it, as ENQUEUE_JOBS would insert it (the same
# columns and idempotency rule; a test holds the two equal) in a plain statement: a sequential
# producer's request waits on this one, and PostgreSQL runs it faster than the contract function
# for one row (no plpgsql call, no unnest; ``bench/insert_paths.py`` measures both).
# $1..$10: INSERTED_COLUMNS, one value each. As built:
#   INSERT INTO jobs (id, ..., namespace) VALUES ($1::uuid, ..., $10::text) RETURNING created_at
# Without a key nothing can conflict: INSERT_JOB has no ON CONFLICT, which would make every
# insert speculative (a second WAL record a row). With one, INSERT_KEYED_JOB returns no row when
# the key names a job already, and ENQUEUE_JOBS answers what that job makes of it.
_INSERT_ROW = (
    "INSERT INTO jobs ("
    + ", ".join(_INSERTED_NAMES)
    + ")\nVALUES ("
    + ", ".join(_INSERTED_PARAMETERS)
    + ")\n"
)
INSERT_JOB: Final = _INSERT_ROW + "RETURNING created_at\n"
INSERT_KEYED_JOB: Final = (
    _INSERT_ROW
    + """ON CONFLICT ((coalesce(namespace, '')), idempotency_key) WHERE idempotency_key IS NOT NULL
DO NOTHING
RETURNING created_at
"""
)

# Every other batch, in one round trip, as ``dispatcher_enqueue_v3`` (sql/0024) stores it: a new
# job, or the one its idempotency key names in its namespace, kept, replaced or extended as each
# job's on_existing asks, or refused; one row per job in order, with its outcome
# (``models.Outcome``). The dispatcher chooses every shard itself; changed jobs are noticed
# (their owner may hold the old time in memory), new ones are not (intake offers them to its
# heap).
# $1..$10: INSERTED_COLUMNS, each a parallel array; $11 key releases (NULL: never); $12
# on_existing; $13 the node id (the history's actor).
ENQUEUE_JOBS: Final = (
    "SELECT ordinal, id, created_at, outcome\nFROM dispatcher_enqueue_v3("
    + ", ".join([*_ENQUEUE_ARRAYS, "$11::text[]", "$12::text[]", "false", "$13::text"])
    + ")\n"
)

# Whole rows of these jobs. $1 ids.
SELECT_JOBS: Final = "SELECT * FROM jobs WHERE id = ANY ($1::uuid[])\n"

# The jobs of an idempotency key, in any namespace allowed by the filter: the one holding it in
# each namespace (jobs_idempotency_key_namespace), then the newest of those that let go of it
# (jobs_released_key). $1 key, $2 namespace filter, $3 routing-key filter.
SELECT_BY_IDEMPOTENCY_KEY: Final = """
SELECT * FROM (
  (SELECT *, false AS released FROM jobs WHERE idempotency_key = $1
     AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
     AND ($3::text[] IS NULL OR EXISTS (
         SELECT FROM unnest($3::text[]) AS w
         WHERE routing_key = w OR starts_with(routing_key, w || '.')))
   ORDER BY id LIMIT 10)
  UNION ALL
  (SELECT *, true AS released FROM jobs WHERE released_key = $1
     AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
     AND ($3::text[] IS NULL OR EXISTS (
         SELECT FROM unnest($3::text[]) AS w
         WHERE routing_key = w OR starts_with(routing_key, w || '.')))
   ORDER BY id DESC LIMIT 10)
) AS found
ORDER BY released, CASE WHEN released THEN NULL ELSE id END, id DESC
LIMIT 10
"""
