"""Named SQL views: the analyses every report and every user shares, kept in the file.

``ensure_views`` (re)creates them on writer open whenever their SQL changed, so any
DuckDB client — the stock ``duckdb`` CLI included — can ``SELECT * FROM round_summary``.
Each view carries a comment: what it holds, and a hash of its SQL.
"""

from __future__ import annotations

import functools
import hashlib
import re

import duckdb

from core.personas import NOT_ATTRIBUTES
from warehouse import depth_views, llm_references, references

#: Attributes with more distinct values than this in an experiment are not treated as
#: categories (free text, ids, raw ages): the demographic views leave them out.
MAX_CATEGORIES = 50

_MARK = re.compile(r"\[keynes:([0-9a-f]{12})\]")

#: Every table and named view a user reads: ``name``, ``kind`` (table or view) and the ``comment``
#: that says what it holds (a view's without the digest of its SQL).
CATALOG = f"""
    SELECT table_name AS name, 'table' AS kind, comment FROM duckdb_tables()
    WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal
    UNION ALL
    SELECT view_name, 'view', trim(regexp_replace(comment, '{_MARK.pattern}', '')) FROM duckdb_views()
    WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal
    ORDER BY kind, name
"""

_ARM = """
    SELECT r.experiment_id, r.run_id, r.arm, r.engine, r.model, r.prompt_mode, r.temperature,
           r.ratio, r.ratio_value, r."offset", r.low, r.high, r.answers, r.rounds, r.equilibrium,
           r.ratio || ' × mean' || CASE WHEN r."offset" = 0 THEN ''
               ELSE ' + ' || regexp_replace(r."offset"::VARCHAR, '\\.0$', '') END
               || ' in [' || regexp_replace(r.low::VARCHAR, '\\.0$', '') || ', '
               || regexp_replace(r.high::VARCHAR, '\\.0$', '') || ']' AS rule,
           r.status, r.started_at, r.finished_at
    FROM runs r
"""

# mean, median, sample sd and a normal 95 % confidence interval of the valid guesses
_STATS = """
           count(*) AS n,
           count(g.guess) AS n_valid,
           1 - count(g.guess) / count(*) AS invalid_rate,
           avg(g.guess) AS mean,
           median(g.guess) AS median,
           stddev_samp(g.guess) AS sd,
           stddev_samp(g.guess) / sqrt(count(g.guess)) AS se,
           avg(g.guess) - 1.96 * stddev_samp(g.guess) / sqrt(count(g.guess)) AS ci95_low,
           avg(g.guess) + 1.96 * stddev_samp(g.guess) / sqrt(count(g.guess)) AS ci95_high
"""

@functools.cache
def _static_views() -> dict[str, tuple[str, str]]:
    """Views whose SQL does not depend on the personas columns: name → (description, SQL)."""
    return {
        "arms": (
            "One row per arm (run): engine, model, prompt mode, temperature, the rule in words, status, wall time.",
            f"""SELECT a.*, e.name AS experiment, epoch(a.finished_at - a.started_at) AS wall_s
                FROM ({_ARM}) a JOIN experiments e USING (experiment_id)""",
        ),
        "experiment_overview": (
            "One row per experiment: config, population size, arms, rounds, guesses, tokens and wall time.",
            """SELECT e.experiment_id, e.name, e.status, e.seed, e.population, e.config, e.created_at, e.finished_at,
                      epoch(e.finished_at - e.created_at) AS wall_s,
                      (SELECT count(*) FROM runs r WHERE r.experiment_id = e.experiment_id) AS arms,
                      (SELECT count(*) FROM rounds d JOIN runs r USING (run_id) WHERE r.experiment_id = e.experiment_id) AS rounds_played,
                      coalesce(g.guesses, 0) AS guesses, coalesce(g.valid, 0) AS valid_guesses,
                      coalesce(g.prompt_tokens, 0) AS prompt_tokens, coalesce(g.completion_tokens, 0) AS completion_tokens
               FROM experiments e LEFT JOIN (
                   SELECT r.experiment_id, count(*) AS guesses, count(g.guess) AS valid,
                          sum(g.prompt_tokens)::BIGINT AS prompt_tokens, sum(g.completion_tokens)::BIGINT AS completion_tokens
                   FROM guesses g JOIN runs r USING (run_id) GROUP BY r.experiment_id) g USING (experiment_id)""",
        ),
        "round_summary": (
            "One row per arm and round: n, valid, invalid rate, mean, median, sd, target, winning number, winners, "
            "equilibrium and the mean's distance to it.",
            f"""SELECT a.experiment_id, a.run_id, a.arm, a.engine, a.model, a.prompt_mode, a.temperature, a.rule,
                       d.round, d.n, d.n_valid, d.n - d.n_valid AS n_invalid, 1 - d.n_valid / d.n AS invalid_rate,
                       d.mean, d.median, d.std AS sd, d.target, d.winning_guess, d.n_winners,
                       a.equilibrium, abs(d.mean - a.equilibrium) AS distance_to_equilibrium, d.seconds
                FROM rounds d JOIN ({_ARM}) a USING (run_id)""",
        ),
        # nullif inside the window function, not around it: DuckDB 1.4.0 cannot run a window function
        # as nullif's argument ("Unimplemented expression class"), and 1.4.0 reads the file (docs/query.md).
        "convergence": (
            "Per arm, round by round: mean, median, target, winning number, distance of the mean to the equilibrium, "
            "its change from the previous round and its share of the first round's distance.",
            f"""SELECT a.experiment_id, a.run_id, a.arm, a.prompt_mode, a.model, a.rule, d.round,
                       d.mean, d.median, d.target, d.winning_guess, a.equilibrium,
                       abs(d.mean - a.equilibrium) AS distance_to_equilibrium,
                       d.mean - lag(d.mean) OVER w AS mean_change,
                       abs(d.mean - a.equilibrium) / first_value(nullif(abs(d.mean - a.equilibrium), 0)) OVER w AS distance_share_of_round1
                FROM rounds d JOIN ({_ARM}) a USING (run_id)
                WINDOW w AS (PARTITION BY d.run_id ORDER BY d.round)""",
        ),
        "guess_stats_by_prompt_mode": (
            "Guesses by experiment, prompt mode and round: n, valid, invalid rate, mean, median, sd, 95 % CI.",
            f"""SELECT a.experiment_id, a.prompt_mode, g.round, {_STATS}
                FROM guesses g JOIN ({_ARM}) a USING (run_id) GROUP BY ALL""",
        ),
        "guess_stats_by_model": (
            "Guesses by experiment, engine, model and round (the model that answered: a mixture's guesses count for "
            "their own models): n, valid, invalid rate, mean, median, sd, 95 % CI.",
            f"""SELECT a.experiment_id, g.engine, g.model, g.round, {_STATS}
                FROM guesses g JOIN ({_ARM}) a USING (run_id) GROUP BY ALL""",
        ),
        "guess_stats_by_rule": (
            "Guesses by experiment, game rule and round: n, valid, invalid rate, mean, median, sd, 95 % CI.",
            f"""SELECT a.experiment_id, a.rule, a.ratio, a."offset", a.low, a.high, a.equilibrium, g.round, {_STATS}
                FROM guesses g JOIN ({_ARM}) a USING (run_id) GROUP BY ALL""",
        ),
        "invalid_answers": (
            "Per arm and round: answers, invalid answers and the invalid rate.",
            f"""SELECT a.experiment_id, a.run_id, a.arm, a.engine, a.model, a.prompt_mode, g.round,
                       count(*) AS n, count(*) FILTER (WHERE NOT g.valid) AS n_invalid,
                       count(*) FILTER (WHERE NOT g.valid) / count(*) AS invalid_rate
                FROM guesses g JOIN ({_ARM}) a USING (run_id) GROUP BY ALL""",
        ),
        "invalid_reasons": (
            "Per arm: why answers were invalid (the stored error) and how often.",
            f"""SELECT a.experiment_id, a.run_id, a.arm, g.error, count(*) AS n
                FROM guesses g JOIN ({_ARM}) a USING (run_id) WHERE NOT g.valid GROUP BY ALL""",
        ),
        "usage_by_arm": (
            "Per arm: calls, prompt and completion tokens (total and per guess), latency (mean, p50, p95, max), "
            "retries and the seconds spent playing.",
            f"""SELECT a.experiment_id, a.run_id, a.arm, a.engine, a.model, a.prompt_mode,
                       count(*) AS guesses,
                       sum(g.prompt_tokens)::BIGINT AS prompt_tokens, sum(g.completion_tokens)::BIGINT AS completion_tokens,
                       avg(g.prompt_tokens) AS prompt_tokens_per_guess,
                       avg(g.completion_tokens) AS completion_tokens_per_guess,
                       avg(g.latency_s) AS latency_mean_s,
                       quantile_cont(g.latency_s, 0.5) AS latency_p50_s,
                       quantile_cont(g.latency_s, 0.95) AS latency_p95_s,
                       max(g.latency_s) AS latency_max_s,
                       coalesce(sum(g.attempts - 1), 0)::BIGINT AS retries,
                       s.play_s
                FROM guesses g JOIN ({_ARM}) a USING (run_id)
                     LEFT JOIN (SELECT run_id, sum(seconds) AS play_s FROM rounds GROUP BY run_id) s USING (run_id)
                GROUP BY ALL""",
        ),
        "guess_histogram": (
            "Per arm and round: valid guesses counted in 50 equal bins over [low, high] (the last bin holds high).",
            f"""SELECT a.experiment_id, a.run_id, a.arm, g.round,
                       a.low + b.bin * (a.high - a.low) / 50 AS bin_low,
                       a.low + (b.bin + 1) * (a.high - a.low) / 50 AS bin_high,
                       count(*) AS n
                FROM guesses g JOIN ({_ARM}) a USING (run_id),
                     LATERAL (SELECT least(floor((g.guess - a.low) * 50 / (a.high - a.low)), 49)::INTEGER AS bin) b
                WHERE g.valid GROUP BY ALL""",
        ),
        "human_reference": (
            "Published results of human players with their source: first-round mean and median (kind 'result', "
            "Nagel 1995) and the cognitive-hierarchy τ fitted to subject pools with its 90 % interval "
            "(kind 'cognitive hierarchy', Camerer, Ho & Chong 2004, Table II), per game rule.",
            f"""SELECT kind, source, pool, ratio, "offset"::DOUBLE AS "offset", low::DOUBLE AS low, high::DOUBLE AS high,
                       round::INTEGER AS round, n::BIGINT AS n, mean::DOUBLE AS mean, median::DOUBLE AS median,
                       tau::DOUBLE AS tau, tau_low::DOUBLE AS tau_low, tau_high::DOUBLE AS tau_high
                FROM (VALUES {references.values_sql()}) AS t({', '.join(f'"{c}"' for c in references.COLUMNS)})""",
        ),
        "llm_reference": (
            "Published results of LLM players with their source, citation and url: per model, prompt mode, game rule "
            "and round, a statistic (round-1 means of GAMA-Bench's guessing game, Huang et al. 2025; the seed paper's "
            "average guesses, Pan et al. 2024, prompts P1-P4 in round 1 and Qwen2-72B's five rounds) with n, players, "
            "runs and the per-run values (NULL where the source does not state them); model_match is a "
            "case-insensitive regular expression an arm's model name matches when it is the same model.",
            f"""SELECT source, citation, url, model, model_id, model_match, prompt_mode, setting,
                       players::INTEGER AS players, runs::INTEGER AS runs, ratio, "offset"::DOUBLE AS "offset",
                       low::DOUBLE AS low, high::DOUBLE AS high, round::INTEGER AS round, statistic,
                       value::DOUBLE AS value, n::BIGINT AS n, run_means::DOUBLE[] AS run_means, derivation
                FROM (VALUES {llm_references.values_sql()}) AS t({', '.join(f'"{c}"' for c in llm_references.COLUMNS)})""",
        ),
        **depth_views.static_views(_ARM),
    }


def _persona_views(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, str]]:
    """Views over the wide ``personas`` table, whose demographic columns vary by population."""
    columns = dict(
        con.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_name = 'personas' ORDER BY ordinal_position"
        ).fetchall()
    )
    derived = ""
    # A numeric age becomes bands when the population did not store its own.
    if "age" in columns and "age_band" not in columns and columns["age"] in ("BIGINT", "INTEGER", "DOUBLE", "FLOAT", "HUGEINT"):
        derived = """, CASE WHEN age IS NULL THEN NULL WHEN age < 25 THEN '18–24' WHEN age < 35 THEN '25–34'
                         WHEN age < 45 THEN '35–44' WHEN age < 55 THEN '45–54' WHEN age < 65 THEN '55–64'
                         ELSE '65+' END AS age_band"""
    present = [c for c in NOT_ATTRIBUTES if c in columns]
    excluded = ", ".join(present)
    # The attributes kept are found by a GROUP BY and a semi join: a window's count(DISTINCT)
    # over every row took 0.58 s for a million personas, this 0.13 s.
    long = f"""
        WITH long AS (
            SELECT experiment_id, agent_id, attribute, value FROM (
                UNPIVOT (SELECT experiment_id, agent_id, COLUMNS(* EXCLUDE ({excluded}))::VARCHAR {derived} FROM personas)
                ON COLUMNS(* EXCLUDE (experiment_id, agent_id)) INTO NAME attribute VALUE value)),
        kept AS (SELECT experiment_id, attribute FROM long GROUP BY ALL HAVING count(DISTINCT value) <= {MAX_CATEGORIES})
        SELECT long.* FROM long SEMI JOIN kept USING (experiment_id, attribute)
    """ if len(columns) > len(present) else (
        "SELECT NULL::VARCHAR AS experiment_id, NULL::BIGINT AS agent_id, NULL::VARCHAR AS attribute, "
        "NULL::VARCHAR AS value WHERE false"
    )
    return {
        "persona_attributes": (
            "Personas in long format, one row per agent and demographic attribute (attribute, value); "
            f"attributes with more than {MAX_CATEGORIES} values in an experiment are left out; a numeric age "
            "also appears as age_band.",
            long,
        ),
        "population_composition": (
            "Per experiment and attribute: each value's count and share of the population.",
            """SELECT experiment_id, attribute, value, count(*) AS n,
                      count(*) / sum(count(*)) OVER (PARTITION BY experiment_id, attribute) AS share
               FROM persona_attributes GROUP BY experiment_id, attribute, value""",
        ),
        "guess_stats_by_attribute": (
            "Guesses by arm, round and each demographic attribute value (long format): n, valid, invalid rate, "
            "mean, median, sd, 95 % CI.",
            f"""SELECT a.experiment_id, a.run_id, a.arm, a.engine, a.model, a.prompt_mode, a.rule, g.round,
                       p.attribute, p.value, {_STATS}
                FROM guesses g JOIN ({_ARM}) a USING (run_id)
                     JOIN persona_attributes p ON p.experiment_id = a.experiment_id AND p.agent_id = g.agent_id
                GROUP BY ALL""",
        ),
        "exact_answers": (
            "Shared-context answers: per arm, round and group (context: one distinct prompt) its exact answer "
            "distribution — answer, probability (no sampling noise) and the agents that drew from it.",
            """SELECT a.experiment_id, a.run_id, a.arm, a.engine, a.model, a.prompt_mode, a.rule, d.round, d.context,
                      d.answer, TRY_CAST(d.answer AS DOUBLE) AS value, avg(d.probability) AS probability,
                      sum(d.agents)::BIGINT AS agents
               FROM answer_distributions d JOIN ({arm}) a USING (run_id)
               GROUP BY ALL""".format(arm=_ARM),
        ),
        "exact_answers_by_attribute": (
            "Shared-context answers by arm, round and demographic attribute value: the exact distribution of "
            "the answer of an agent drawn at random from that value (the mixture of its agents' groups), its "
            "expected answer, entropy (bits) and mode — for the reports, without sampling noise.",
            """WITH members AS (
                   SELECT g.run_id, g.round, g.context, p.attribute, p.value, count(*) AS agents
                   FROM guesses g JOIN runs r USING (run_id)
                        JOIN persona_attributes p ON p.experiment_id = r.experiment_id AND p.agent_id = g.agent_id
                   WHERE g.context IS NOT NULL GROUP BY ALL),
               dist AS (
                   SELECT run_id, round, context, answer, avg(probability) AS probability
                   FROM answer_distributions GROUP BY ALL),
               mixture AS (
                   SELECT m.run_id, m.round, m.attribute, m.value, d.answer,
                          sum(m.agents * d.probability) / any_value(t.agents) AS probability, any_value(t.agents) AS agents
                   FROM members m JOIN dist d USING (run_id, round, context)
                        JOIN (SELECT run_id, round, attribute, value, sum(agents) AS agents FROM members GROUP BY ALL) t
                          USING (run_id, round, attribute, value)
                   GROUP BY ALL)
               SELECT a.experiment_id, a.run_id, a.arm, a.engine, a.model, a.prompt_mode, a.rule, x.round,
                      x.attribute, x.value, any_value(x.agents)::BIGINT AS agents,
                      sum(x.probability * TRY_CAST(x.answer AS DOUBLE)) AS expected,
                      -sum(CASE WHEN x.probability > 0 THEN x.probability * log2(x.probability) ELSE 0 END) AS entropy_bits,
                      arg_max(x.answer, x.probability) AS mode, max(x.probability) AS mode_probability,
                      sum(x.probability) AS total_probability
               FROM mixture x JOIN ({arm}) a USING (run_id)
               GROUP BY ALL""".format(arm=_ARM),
        ),
        **depth_views.persona_views(_ARM),
    }


def definitions(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, str]]:
    """Every view this keynes defines for the file behind ``con``: name → (description, SQL)."""
    views = dict(_static_views())  # a copy: the cached static views stay as they are
    views.update(_persona_views(con))
    return views


@functools.lru_cache(maxsize=256)
def _digest(sql: str) -> str:
    return hashlib.sha256(" ".join(sql.split()).encode()).hexdigest()[:12]


def stale_views(con: duckdb.DuckDBPyConnection, views: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """Names of views that are missing or whose SQL differs from this keynes's definition
    (``views``: the file's ``definitions``, when the caller has them already)."""
    have = {
        name: (m.group(1) if (m := _MARK.search(comment or "")) else None)
        for name, comment in con.execute("SELECT view_name, comment FROM duckdb_views() WHERE NOT internal").fetchall()
    }
    views = definitions(con) if views is None else views
    return [name for name, (_, sql) in views.items() if have.get(name) != _digest(sql)]


def ensure_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Create or replace the views that are missing or out of date; return their names.

    Order matters: ``population_composition``, ``guess_stats_by_attribute`` and
    ``exact_answers_by_attribute`` read ``persona_attributes``, which is defined before them.
    """
    views = definitions(con)
    stale = stale_views(con, views)
    for name in stale:
        description, sql = views[name]
        try:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
        except duckdb.Error as exc:
            raise RuntimeError(f"view {name}: {exc}") from exc
        comment = f"{description} [keynes:{_digest(sql)}]".replace("'", "''")
        con.execute(f"COMMENT ON VIEW {name} IS '{comment}'")
    return stale
