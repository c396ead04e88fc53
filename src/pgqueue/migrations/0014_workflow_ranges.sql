-- A workflow's jobs are found by the range of their ids, not by an index on
-- workflow_id.
--
-- Every claim and every ack is an update that changes the job's state, so
-- not a HOT update: each writes a new entry into every index whose
-- predicate the new row version satisfies. pgqueue_jobs_workflow (0011)
-- took one at each claim and each ack of every workflow job, for the sake of
-- three rare statements (show, cancel and retry a workflow). A workflow's
-- jobs are inserted by one statement with ids reserved together, so they
-- lie between the smallest and the largest of those ids (other producers'
-- jobs may lie there too: the statements also test workflow_id). One row
-- per workflow says where; the three statements read the jobs' primary key
-- over that range.
CREATE TABLE pgqueue_workflows (
    id        uuid   PRIMARY KEY,
    first_job bigint NOT NULL,
    last_job  bigint NOT NULL
);

INSERT INTO pgqueue_workflows (id, first_job, last_job)
SELECT workflow_id, min(id), max(id) FROM pgqueue_jobs
WHERE workflow_id IS NOT NULL
GROUP BY workflow_id;

DROP INDEX pgqueue_jobs_workflow;
