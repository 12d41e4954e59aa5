"""SQL views of reasoning depth: level-k steps and classes, and the Python-computed analyses.

``level_k_steps``, ``guess_depth`` and ``reasoning_depth`` are plain SQL over the guesses.
``cognitive_hierarchy_fit`` and ``paired_comparisons`` show the tables ``tau_fits`` and
``paired_tests``, which ``warehouse.analyses`` fills (scipy cannot run inside a view).
"""

from __future__ import annotations

#: Guesses this close to the equilibrium (in game units) are "at equilibrium", and iterated
#: best responses stop once a step is this close: a step half a unit away is the
#: equilibrium for an integer answer.
EQUILIBRIUM_BAND = 0.5
#: The status of a stored round whose analyses are missing (a warehouse written before keynes
#: computed them as rounds land, or a failed computation).
PENDING = "not computed yet: keynes report, or the next round stored, computes it"
#: Steps are followed at most this far (2/3 of the average reaches the band at step 12).
MAX_STEPS = 60

# Each run's steps x_0 = (low + high) / 2, x_{k+1} = clamp(ratio × x_k + offset), in
# normalised distance to the equilibrium e: s_k = (x_k − e) / (x_0 − e) (s_0 = 1; s_k = p^k
# without clamping). Step k owns (t_low, t_high] of t = (guess − e) / (x_0 − e):
# boundaries at the geometric means of neighbouring steps (Nagel 1995: 50·p^(k ± 1/2) for
# offset 0), step 0 symmetric in log scale about s_0, the last step down to the band.
_STEPS = f"""
    WITH RECURSIVE walk(run_id, level, x) AS (
        SELECT run_id, 0, (low + high) / 2 FROM runs
        UNION ALL
        SELECT w.run_id, w.level + 1, least(greatest(r.ratio_value * w.x + r."offset", r.low), r.high)
        FROM walk w JOIN runs r USING (run_id)
        WHERE w.level < {MAX_STEPS} AND abs(w.x - r.equilibrium) > {EQUILIBRIUM_BAND}
    ),
    steps AS (
        SELECT w.run_id, w.level, w.x AS step, r.equilibrium, (r.low + r.high) / 2 - r.equilibrium AS d0,
               (w.x - r.equilibrium) / ((r.low + r.high) / 2 - r.equilibrium) AS s
        FROM walk w JOIN runs r USING (run_id)
        WHERE abs(w.x - r.equilibrium) > {EQUILIBRIUM_BAND}
    ),
    lows AS (
        SELECT *, coalesce(sqrt(greatest(s * lead(s) OVER w, 0)), {EQUILIBRIUM_BAND} / abs(d0)) AS t_low,
               sqrt(greatest(s * lag(s) OVER w, 0)) AS t_above
        FROM steps WINDOW w AS (PARTITION BY run_id ORDER BY level)
    )
    SELECT r.experiment_id, l.run_id, r.arm, l.level, l.step, l.equilibrium,
           l.t_low, CASE WHEN l.level = 0 THEN 1 / l.t_low ELSE l.t_above END AS t_high,
           least(l.equilibrium + l.d0 * l.t_low, l.equilibrium + l.d0 * CASE WHEN l.level = 0 THEN 1 / l.t_low ELSE l.t_above END) AS guess_low,
           greatest(l.equilibrium + l.d0 * l.t_low, l.equilibrium + l.d0 * CASE WHEN l.level = 0 THEN 1 / l.t_low ELSE l.t_above END) AS guess_high
    FROM lows l JOIN runs r USING (run_id)
"""

_GUESS_DEPTH = f"""
    SELECT g.run_id, g.round, g.agent_id, g.guess,
           CASE WHEN g.at_equilibrium THEN NULL ELSE s.level END AS level,
           CASE WHEN g.at_equilibrium THEN 'equilibrium'
                WHEN s.level IS NOT NULL THEN 'step ' || s.level
                WHEN g.t < 0 THEN 'beyond equilibrium'
                ELSE 'above step 0' END AS class,
           CASE WHEN g.at_equilibrium THEN 1000 WHEN s.level IS NOT NULL THEN s.level
                WHEN g.t < 0 THEN 1001 ELSE -1 END AS class_rank,
           CASE WHEN g.at_equilibrium THEN g.equilibrium ELSE s.step END AS step
    FROM (SELECT g.run_id, g.round, g.agent_id, g.guess, r.equilibrium,
                 abs(g.guess - r.equilibrium) <= {EQUILIBRIUM_BAND} AS at_equilibrium,
                 (g.guess - r.equilibrium) / nullif((r.low + r.high) / 2 - r.equilibrium, 0) AS t
          FROM guesses g JOIN runs r USING (run_id) WHERE g.valid) g
    LEFT JOIN level_k_steps s ON s.run_id = g.run_id AND g.t > s.t_low AND g.t <= s.t_high AND NOT g.at_equilibrium
"""


def static_views(arm_sql: str) -> dict[str, tuple[str, str]]:
    """Views that do not depend on the personas columns: name → (description, SQL)."""
    return {
        "level_k_steps": (
            "Per arm, the iterated best responses x_0 = (low + high) / 2, x_(k+1) = clamp(ratio × x_k + offset) up to "
            f"{EQUILIBRIUM_BAND} from the equilibrium, and the guesses each step's class holds (guess_low, guess_high]: "
            "boundaries at the geometric means of neighbouring steps' distances to the equilibrium.",
            _STEPS,
        ),
        "guess_depth": (
            "Every valid guess with its level-k class: 'step k' (level = k), 'above step 0', 'equilibrium' "
            f"(within {EQUILIBRIUM_BAND}) or 'beyond equilibrium' (the other side of it); class_rank orders classes.",
            _GUESS_DEPTH,
        ),
        "cognitive_hierarchy_fit": (
            "Per arm and round, and per arm, round and persona attribute value (attribute/value NULL for the whole "
            "arm): the cognitive-hierarchy τ whose population mean equals the mean guess, with a bootstrap 95 % "
            "interval; fit = 'no τ fits' when the mean lies outside [ch_mean_min, ch_mean_max]. Computed by keynes "
            "as each round is stored (table tau_fits); status says 'computed', or why a stored round has no fit yet.",
            f"""SELECT a.experiment_id, f.run_id, a.arm, a.engine, a.model, a.prompt_mode, a.temperature, a.rule,
                       a.ratio, a."offset", a.low, a.high, f.round, f.attribute, f.value, f.n, f.mean,
                       f.tau, f.tau_low, f.tau_high, f.fit, f.ch_mean_min, f.ch_mean_max, f.method, f.computed_at,
                       'computed' AS status
                FROM tau_fits f JOIN ({arm_sql}) a USING (run_id)
                UNION ALL BY NAME
                SELECT a.experiment_id, r.run_id, a.arm, a.engine, a.model, a.prompt_mode, a.temperature, a.rule,
                       a.ratio, a."offset", a.low, a.high, r.round, '{PENDING}' AS status
                FROM rounds r JOIN ({arm_sql}) a USING (run_id)
                WHERE NOT EXISTS (SELECT 1 FROM tau_fits f WHERE f.run_id = r.run_id AND f.round = r.round)""",
        ),
        "paired_comparisons": (
            "Per round, every pair of arms of one experiment that differ in exactly one factor (prompt mode, model, "
            "temperature or game), compared agent by agent: mean difference a − b with its 95 % t interval, median "
            "difference and the Wilcoxon signed-rank p-value. Computed by keynes as each round is stored (table "
            "paired_tests); status says 'computed', or, in one row per experiment and round without a comparison, why.",
            f"""WITH arms_of AS (SELECT experiment_id, count(*) AS arms FROM ({arm_sql}) GROUP BY experiment_id),
                stored AS (SELECT a.experiment_id, r.round, count(*) AS arms_stored,
                                  count(*) FILTER (WHERE EXISTS (SELECT 1 FROM tau_fits f
                                                                 WHERE f.run_id = r.run_id AND f.round = r.round)) AS analysed
                           FROM rounds r JOIN ({arm_sql}) a USING (run_id) GROUP BY a.experiment_id, r.round)
                SELECT a.experiment_id, t.round, t.factor, a.arm AS arm_a, b.arm AS arm_b, t.level_a, t.level_b,
                       t.run_a, t.run_b, t.n_pairs, t.mean_a, t.mean_b, t.mean_difference, t.ci95_low, t.ci95_high,
                       t.median_difference, t.wilcoxon_statistic, t.wilcoxon_p, t.note, t.method, t.computed_at,
                       'computed' AS status
                FROM paired_tests t JOIN ({arm_sql}) a ON a.run_id = t.run_a JOIN ({arm_sql}) b ON b.run_id = t.run_b
                UNION ALL BY NAME
                SELECT s.experiment_id, s.round,
                       CASE WHEN n.arms = 1 THEN 'one arm: nothing to compare'
                            WHEN s.arms_stored < n.arms THEN 'waiting: ' || (n.arms - s.arms_stored) || ' of '
                                 || n.arms || ' arms have not stored this round yet'
                            WHEN s.analysed < s.arms_stored THEN '{PENDING}'
                            ELSE 'no two arms differ in exactly one factor' END AS status
                FROM stored s JOIN arms_of n USING (experiment_id)
                WHERE NOT EXISTS (SELECT 1 FROM paired_tests t JOIN runs x ON x.run_id = t.run_a
                                  WHERE x.experiment_id = s.experiment_id AND t.round = s.round)""",
        ),
    }


def persona_views(arm_sql: str) -> dict[str, tuple[str, str]]:
    """Views that read ``persona_attributes`` (defined before them)."""
    return {
        "reasoning_depth": (
            "Shares of the level-k classes of guess_depth per arm and round (attribute/value NULL), and per arm, round "
            "and persona attribute value: n and share of the valid guesses.",
            f"""WITH d AS (SELECT d.*, a.experiment_id, a.arm, a.model, a.prompt_mode, a.rule
                           FROM guess_depth d JOIN ({arm_sql}) a USING (run_id))
                SELECT experiment_id, run_id, arm, model, prompt_mode, rule, round, attribute, value,
                       class, level, class_rank, step, n, n / sum(n) OVER (PARTITION BY run_id, round, attribute, value) AS share
                FROM (SELECT experiment_id, run_id, arm, model, prompt_mode, rule, round, NULL::VARCHAR AS attribute,
                             NULL::VARCHAR AS value, class, level, class_rank, step, count(*) AS n
                      FROM d GROUP BY ALL
                      UNION ALL
                      SELECT d.experiment_id, d.run_id, d.arm, d.model, d.prompt_mode, d.rule, d.round, p.attribute,
                             p.value, d.class, d.level, d.class_rank, d.step, count(*) AS n
                      FROM d JOIN persona_attributes p ON p.experiment_id = d.experiment_id AND p.agent_id = d.agent_id
                      GROUP BY ALL)""",
        ),
        "reasoning_texts": (
            "Every guess that came with a reasoning text (chain-of-thought arms), with the agent's persona in words "
            "(its attribute values) and whether it won the round.",
            f"""SELECT a.experiment_id, g.run_id, a.arm, a.model, a.prompt_mode, g.round, g.agent_id, g.guess, g.valid,
                       g.reasoning, g.raw, p.persona, w.agent_id IS NOT NULL AS winner
                FROM guesses g JOIN ({arm_sql}) a USING (run_id)
                     LEFT JOIN (SELECT experiment_id, agent_id,
                                       string_agg(attribute || ': ' || value, ', ' ORDER BY attribute) AS persona
                                FROM persona_attributes GROUP BY ALL) p
                       ON p.experiment_id = a.experiment_id AND p.agent_id = g.agent_id
                     LEFT JOIN winners w ON w.run_id = g.run_id AND w.round = g.round AND w.agent_id = g.agent_id
                WHERE g.reasoning IS NOT NULL""",
        ),
        "reasoning_highlights": (
            "Per arm and round with reasoning texts: the lowest, median and highest valid guess and up to three "
            "winners (lowest agent ids), each with its reasoning and persona (from reasoning_texts).",
            """WITH t AS (SELECT *, row_number() OVER (PARTITION BY run_id, round ORDER BY guess, agent_id) AS position,
                                count(*) OVER (PARTITION BY run_id, round) AS n_valid
                         FROM reasoning_texts WHERE valid)
               SELECT * EXCLUDE (position, n_valid) FROM (
                   SELECT CASE WHEN position = 1 THEN 'lowest' WHEN position = n_valid THEN 'highest'
                               ELSE 'median' END AS pick, *
                   FROM t WHERE position IN (1, (n_valid + 1) // 2, n_valid)
                   UNION ALL
                   SELECT 'winner' AS pick, * FROM t
                   WHERE winner QUALIFY row_number() OVER (PARTITION BY run_id, round ORDER BY agent_id) <= 3)""",
        ),
    }
