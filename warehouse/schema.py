"""The DuckDB schema, versioned: one row per fact, keys that make writes idempotent.

``migrate`` brings any keynes warehouse up to ``SCHEMA_VERSION``; a file written by a
newer keynes is refused with a clear message instead of being damaged.
"""

from __future__ import annotations

import duckdb

#: Each entry upgrades the schema from version (index) to version (index + 1).
MIGRATIONS: list[str] = [
    # 0 -> 1: experiments, runs, personas, guesses, shards, rounds, winners
    """
    CREATE TABLE IF NOT EXISTS experiments (
        experiment_id VARCHAR PRIMARY KEY,
        name          VARCHAR NOT NULL,
        config        JSON NOT NULL,
        config_hash   VARCHAR NOT NULL,
        seed          BIGINT NOT NULL,
        population    BIGINT NOT NULL,
        created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
        finished_at   TIMESTAMPTZ,
        status        VARCHAR NOT NULL
    );
    CREATE TABLE IF NOT EXISTS runs (
        run_id        VARCHAR PRIMARY KEY,
        experiment_id VARCHAR NOT NULL,
        arm           INTEGER NOT NULL,
        engine        VARCHAR NOT NULL,
        model         VARCHAR NOT NULL,
        prompt_mode   VARCHAR NOT NULL,
        temperature   DOUBLE NOT NULL,
        ratio         VARCHAR NOT NULL,
        ratio_value   DOUBLE NOT NULL,
        "offset"      DOUBLE NOT NULL,
        low           DOUBLE NOT NULL,
        high          DOUBLE NOT NULL,
        answers       VARCHAR NOT NULL,
        tolerance     DOUBLE NOT NULL,
        rounds        INTEGER NOT NULL,
        equilibrium   DOUBLE NOT NULL,
        spec          JSON NOT NULL,
        status        VARCHAR NOT NULL,
        started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
        finished_at   TIMESTAMPTZ
    );
    CREATE TABLE IF NOT EXISTS personas (
        experiment_id VARCHAR NOT NULL,
        agent_id      BIGINT NOT NULL,
        background    VARCHAR,
        PRIMARY KEY (experiment_id, agent_id)
    );
    CREATE TABLE IF NOT EXISTS guesses (
        run_id            VARCHAR NOT NULL,
        round             INTEGER NOT NULL,
        agent_id          BIGINT NOT NULL,
        shard             INTEGER NOT NULL,
        engine            VARCHAR NOT NULL,
        model             VARCHAR NOT NULL,
        guess             DOUBLE,
        valid             BOOLEAN NOT NULL,
        raw               VARCHAR,
        reasoning         VARCHAR,
        prompt_tokens     INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        latency_s         DOUBLE NOT NULL,
        attempts          INTEGER NOT NULL,
        error             VARCHAR
    );
    CREATE TABLE IF NOT EXISTS shards (
        run_id       VARCHAR NOT NULL,
        round        INTEGER NOT NULL,
        shard        INTEGER NOT NULL,
        n            INTEGER NOT NULL,
        node         VARCHAR NOT NULL,
        worker       VARCHAR NOT NULL,
        seconds      DOUBLE NOT NULL,
        committed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, round, shard)
    );
    CREATE TABLE IF NOT EXISTS rounds (
        run_id        VARCHAR NOT NULL,
        round         INTEGER NOT NULL,
        n             BIGINT NOT NULL,
        n_valid       BIGINT NOT NULL,
        mean          DOUBLE,
        median        DOUBLE,
        std           DOUBLE,
        target        DOUBLE,
        winning_guess DOUBLE,
        n_winners     BIGINT NOT NULL,
        seconds       DOUBLE NOT NULL,
        PRIMARY KEY (run_id, round)
    );
    CREATE TABLE IF NOT EXISTS winners (
        run_id   VARCHAR NOT NULL,
        round    INTEGER NOT NULL,
        agent_id BIGINT NOT NULL
    );
    """,
    # 1 -> 2: LLM-written persona backstories, cached across runs and experiments
    """
    CREATE TABLE IF NOT EXISTS backstories (
        key               VARCHAR PRIMARY KEY,  -- sha256 of (attributes, template_hash, model, seed, sampling)
        attributes        JSON NOT NULL,
        template_hash     VARCHAR NOT NULL,
        engine            VARCHAR NOT NULL,
        model             VARCHAR NOT NULL,
        seed              BIGINT NOT NULL,
        temperature       DOUBLE NOT NULL,
        max_tokens        INTEGER NOT NULL,
        prompt            VARCHAR NOT NULL,
        raw               VARCHAR NOT NULL,
        background        VARCHAR NOT NULL,
        prompt_tokens     INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        latency_s         DOUBLE NOT NULL,
        created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    """,
    # 2 -> 3: groups (nested environments): who plays in which group, and each group's
    # own outcome and winners every round, beside the global `rounds` and `winners`
    """
    CREATE TABLE IF NOT EXISTS group_members (
        experiment_id VARCHAR NOT NULL,
        agent_id      BIGINT NOT NULL,
        group_name    VARCHAR NOT NULL,
        PRIMARY KEY (experiment_id, agent_id)
    );
    CREATE TABLE IF NOT EXISTS group_rounds (
        run_id        VARCHAR NOT NULL,
        round         INTEGER NOT NULL,
        group_name    VARCHAR NOT NULL,
        n             BIGINT NOT NULL,
        n_valid       BIGINT NOT NULL,
        mean          DOUBLE,
        median        DOUBLE,
        std           DOUBLE,
        target        DOUBLE,
        winning_guess DOUBLE,
        n_winners     BIGINT NOT NULL,
        PRIMARY KEY (run_id, round, group_name)
    );
    CREATE TABLE IF NOT EXISTS group_winners (
        run_id     VARCHAR NOT NULL,
        round      INTEGER NOT NULL,
        group_name VARCHAR NOT NULL,
        agent_id   BIGINT NOT NULL
    );
    """,
    # 3 -> 4: reasoning-depth analyses that need scipy, so keynes computes them in Python
    # (warehouse.analyses) and stores them here; the views cognitive_hierarchy_fit and
    # paired_comparisons show them. attribute/value NULL: the whole arm.
    """
    CREATE TABLE IF NOT EXISTS tau_fits (
        run_id      VARCHAR NOT NULL,
        round       INTEGER NOT NULL,
        attribute   VARCHAR,
        value       VARCHAR,
        n           BIGINT NOT NULL,
        mean        DOUBLE,
        tau         DOUBLE,
        tau_low     DOUBLE,
        tau_high    DOUBLE,
        fit         VARCHAR NOT NULL,
        ch_mean_min DOUBLE NOT NULL,
        ch_mean_max DOUBLE NOT NULL,
        method      VARCHAR NOT NULL,
        computed_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE TABLE IF NOT EXISTS paired_tests (
        run_a              VARCHAR NOT NULL,
        run_b              VARCHAR NOT NULL,
        round              INTEGER NOT NULL,
        factor             VARCHAR NOT NULL,
        level_a            VARCHAR NOT NULL,
        level_b            VARCHAR NOT NULL,
        n_pairs            BIGINT NOT NULL,
        mean_a             DOUBLE,
        mean_b             DOUBLE,
        mean_difference    DOUBLE,
        ci95_low           DOUBLE,
        ci95_high          DOUBLE,
        median_difference  DOUBLE,
        wilcoxon_statistic DOUBLE,
        wilcoxon_p         DOUBLE,
        note               VARCHAR,
        method             VARCHAR NOT NULL,
        computed_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (run_a, run_b, round)
    );
    """,
    # 4 -> 5: runs.prompting: how the run's engine formatted prompts (completion or chat) and
    # the sha256 of the chat template it applied, so the text every agent saw is reproducible
    """
    ALTER TABLE runs ADD COLUMN IF NOT EXISTS prompting JSON;
    """,
    # 5 -> 6: seconds each shard's requests waited on the engine's rate limits (openai engine's
    # requests_per_minute / tokens_per_minute); 0 for engines without limits
    """
    ALTER TABLE shards ADD COLUMN IF NOT EXISTS limit_wait_s DOUBLE DEFAULT 0;
    """,
    # 6 -> 7: the run's sampling chain (runs.sampling); shared-context answers: each guess says
    # whether its prompt was evaluated once for its whole group (shared_prompt) and which group
    # (context); each group's exact answer distribution, per shard that played it (a shard's
    # rows commit with its guesses)
    """
    ALTER TABLE guesses ADD COLUMN shared_prompt BOOLEAN NOT NULL DEFAULT false;
    ALTER TABLE guesses ADD COLUMN context VARCHAR;
    ALTER TABLE runs ADD COLUMN sampling JSON;   -- arms.sampling: top_p, top_k, min_p, repeat_penalty
    CREATE TABLE IF NOT EXISTS answer_distributions (
        run_id      VARCHAR NOT NULL,
        round       INTEGER NOT NULL,
        shard       INTEGER NOT NULL,
        context     VARCHAR NOT NULL,   -- hash of the prompt, sampling chain and constraint
        answer      VARCHAR NOT NULL,   -- the answer text, as stored in guesses.raw
        probability DOUBLE NOT NULL,
        agents      BIGINT NOT NULL,    -- the shard's agents with this context
        PRIMARY KEY (run_id, round, shard, context, answer)
    );
    """,
    # 7 -> 8: the work of a shard's shared-context answers, on engines that count it (llama.cpp):
    # tokens decoded, and the least that could have been (the trie of its distinct prompts plus
    # one token per answer-tree node); NULL elsewhere
    """
    ALTER TABLE shards ADD COLUMN tokens_evaluated BIGINT;
    ALTER TABLE shards ADD COLUMN tokens_bound BIGINT;
    """,
    # 8 -> 9: what decided an experiment's answers beyond its config (experiments.inputs: each
    # template's, model's and chat template's digest, recorded by its first run; NULL: recorded
    # before inputs were) and what computed each run (provenance: one row per arm and session,
    # a session being one run of the flow)
    """
    ALTER TABLE experiments ADD COLUMN IF NOT EXISTS inputs JSON;
    CREATE TABLE IF NOT EXISTS provenance (
        run_id         VARCHAR NOT NULL,
        session        VARCHAR NOT NULL,   -- the flow run that played it (Prefect's flow run id)
        experiment_id  VARCHAR NOT NULL,
        started_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
        finished_at    TIMESTAMPTZ,
        rounds         INTEGER[],          -- the rounds this session played, once it finished them
        keynes_version VARCHAR,
        git_commit     VARCHAR,            -- NULL: keynes not run from a git checkout
        git_modified   BOOLEAN,            -- the checkout had uncommitted changes
        python         VARCHAR NOT NULL,
        packages       JSON NOT NULL,      -- name -> version of the packages that compute answers
        models         JSON NOT NULL,      -- model and chat template digests (as experiments.inputs names them)
        templates      JSON NOT NULL,      -- prompt template digests, includes too
        machine        JSON NOT NULL,      -- cpu, cores, vector_extensions, gpus, platform, memory_gib
        PRIMARY KEY (run_id, session)
    );
    """,
]


SCHEMA_VERSION = len(MIGRATIONS)


class SchemaError(RuntimeError):
    """The file is not a keynes warehouse this version can use."""


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """The schema version recorded in the file (0 for an empty file)."""
    con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = con.execute("SELECT max(version) FROM schema_version").fetchall()[0]
    return row[0] or 0


def check_schema(con: duckdb.DuckDBPyConnection) -> int:
    """The file's schema version (0 for an empty file), without writing anything.

    Raises:
        SchemaError: the file is not a keynes warehouse, or one newer than this keynes.
    """
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
    if tables and "schema_version" not in tables:
        raise SchemaError(f"not a keynes warehouse: it has tables {sorted(tables)[:5]} but no schema_version")
    version = con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] or 0 if tables else 0
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"the warehouse has schema version {version}, newer than this keynes ({SCHEMA_VERSION}); upgrade keynes"
        )
    return version


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Upgrade the schema to ``SCHEMA_VERSION`` in one transaction; return the old version."""
    if check_schema(con) == SCHEMA_VERSION:  # the usual case: read only, nothing to write
        return SCHEMA_VERSION
    version = current_version(con)
    con.execute("BEGIN TRANSACTION")
    try:
        for step in range(version, SCHEMA_VERSION):
            con.execute(MIGRATIONS[step])
            con.execute("INSERT INTO schema_version VALUES (?)", [step + 1])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return version
