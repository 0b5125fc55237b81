"""Job dependencies (sql/0006, 0010: the trigger that releases or cancels dependents)."""

from typing import Final

# Lock the prerequisites a submission names, in id order (so two submissions cannot deadlock on
# them), and mark them as having dependents. The lock makes a prerequisite's state change wait for
# the submission to commit (its trigger then sees the new edges), or the submission read the state
# that change committed: either way no dependent misses its release.
# $1 prerequisite ids, $2 the namespace they must be in ('' for the default one), $3 the
# routing-key filter of the submitter's key (a job outside it is not found, as a random id).
LOCK_PREREQUISITES: Final = """
WITH locked AS (
    SELECT id, state, has_dependents FROM jobs
    WHERE id = ANY($1::uuid[]) AND coalesce(namespace, '') = $2
      AND ($3::text[] IS NULL OR EXISTS (
          SELECT FROM unnest($3::text[]) AS w
          WHERE routing_key = w OR starts_with(routing_key, w || '.')))
    ORDER BY id
    FOR NO KEY UPDATE
), flagged AS (
    UPDATE jobs j SET has_dependents = true FROM locked
    WHERE j.id = locked.id AND NOT locked.has_dependents
)
SELECT id, state FROM locked
"""

# $1 job ids, $2 prerequisite ids, $3 positions in `after`, $4 satisfied: parallel arrays.
INSERT_DEPENDENCIES: Final = """
INSERT INTO job_dependencies (job_id, prerequisite_id, position, satisfied)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::smallint[], $4::boolean[])
"""

# Jobs just inserted that wait for prerequisites not yet succeeded. $1 ids, $2 how many each.
MARK_WAITING: Final = """
UPDATE jobs j SET state = 'waiting', waiting_for = w.pending
FROM unnest($1::uuid[], $2::int[]) AS w(id, pending)
WHERE j.id = w.id
"""

# A job's prerequisites in the order it named them. $1 job id.
SELECT_PREREQUISITES: Final = """
SELECT prerequisite_id, satisfied FROM job_dependencies WHERE job_id = $1 ORDER BY position
"""

# The oldest follow-up the 0010 trigger deferred whose prerequisite has no older one waiting
# (a prerequisite's follow-ups are worked in order), locked for one batch; another node's is
# skipped. No arguments.
CLAIM_FOLLOWUP: Final = """
SELECT f.id, f.prerequisite_id, f.state, f.created_at, f.cursor FROM dependency_followups f
WHERE NOT EXISTS (
    SELECT 1 FROM dependency_followups earlier
    WHERE earlier.prerequisite_id = f.prerequisite_id AND earlier.id < f.id
)
ORDER BY f.id
LIMIT 1
FOR UPDATE SKIP LOCKED
"""

# One batch of a follow-up: the prerequisite's next dependents after the cursor, released or
# cancelled (sql/0010's dispatcher_follow_dependents, which the trigger follows them with too);
# the trigger a cancel fires follows that job's own dependents in turn. Returns followed,
# last_job_id, released, cancelled.
# $1 prerequisite id, $2 its state, $3 when it reached it, $4 cursor, $5 batch size.
FOLLOW_DEPENDENTS: Final = "SELECT * FROM dispatcher_follow_dependents($1, $2, $3, $4, $5)"

# $1 follow-up id, $2 the last dependent followed.
ADVANCE_FOLLOWUP: Final = "UPDATE dependency_followups SET cursor = $2 WHERE id = $1"

# Its last batch is done. $1 follow-up id.
DELETE_FOLLOWUP: Final = "DELETE FROM dependency_followups WHERE id = $1"
