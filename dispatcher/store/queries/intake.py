"""Intake: storing new jobs (one statement per batch) and finding them by id or idempotency key."""

from typing import Final

# The columns intake writes, each with the type its parameter is cast to, in the order of
# ``dispatcher_enqueue_v1``'s arrays (sql/0012). INSERT_JOBS and INSERT_JOB are built from it once,
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

# Insert a batch in one round trip, through the contract function (sql/0012) the SDK's enqueue
# calls too; an idempotency key seen before in the namespace inserts nothing. The dispatcher
# chooses every shard itself and sends no due notice (it puts the jobs on its heap). Only what the
# caller does not know already comes back (decoding whole rows cost more than the insert).
# $1..$10: INSERTED_COLUMNS, each a parallel array. As built:
#   SELECT id, created_at FROM dispatcher_enqueue_v1($1::uuid[], $2::int[], NULL, $3::text[],
#       ..., $10::text[], false)
INSERT_JOBS: Final = (
    "SELECT id, created_at\nFROM dispatcher_enqueue_v1("
    + ", ".join([*_ENQUEUE_ARRAYS, "false"])
    + ")\n"
)

# One job, as INSERT_JOBS would insert it (the same columns, and the idempotency rule of
# ``dispatcher_enqueue_v1``, which a test holds equal) in a plain statement: a sequential
# producer's request waits on this one, and PostgreSQL runs it in about three quarters of the
# contract function's time for a single row (no plpgsql call, no unnest).
# $1..$10: INSERTED_COLUMNS, one value each. As built:
#   INSERT INTO jobs (id, ..., namespace) VALUES ($1::uuid, ..., $10::text)
#   ON CONFLICT ((coalesce(namespace, '')), idempotency_key) WHERE idempotency_key IS NOT NULL
#   DO NOTHING RETURNING id, created_at
INSERT_JOB: Final = (
    "INSERT INTO jobs ("
    + ", ".join(_INSERTED_NAMES)
    + ")\nVALUES ("
    + ", ".join(_INSERTED_PARAMETERS)
    + ")\n"
    + """ON CONFLICT ((coalesce(namespace, '')), idempotency_key) WHERE idempotency_key IS NOT NULL
DO NOTHING
RETURNING id, created_at
"""
)

# Jobs as ``dispatcher_enqueue_v2`` (sql/0019) inserts or changes them: a new job, or the pending
# one its idempotency key names, replaced or extended, as each job's on_existing asks; one row
# per job in order, with its outcome (``models.Outcome``). Changed jobs are noticed (their owner
# may hold the old time in memory); new ones are not (intake offers them to its heap).
# $1..$10: INSERTED_COLUMNS, each a parallel array; $11 key releases (NULL: never); $12
# on_existing; $13 the node id (the history's actor).
ENQUEUE_JOBS: Final = (
    "SELECT ordinal, id, created_at, outcome\nFROM dispatcher_enqueue_v2("
    + ", ".join([*_ENQUEUE_ARRAYS, "$11::text[]", "$12::text[]", "false", "$13::text"])
    + ")\n"
)

# Whole rows of these jobs. $1 ids.
SELECT_JOBS: Final = "SELECT * FROM jobs WHERE id = ANY ($1::uuid[])\n"

# The jobs already stored under these idempotency keys, each in its namespace.
# $1 namespaces ('' for the default one), $2 keys: parallel arrays.
SELECT_BY_IDEMPOTENCY_KEYS: Final = """
SELECT j.* FROM jobs j
JOIN unnest($1::text[], $2::text[]) AS k(namespace, idempotency_key)
  ON coalesce(j.namespace, '') = k.namespace AND j.idempotency_key = k.idempotency_key
"""

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
