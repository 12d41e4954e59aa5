"""Published results of LLM players, each row with its source and citation, for the ``llm_reference`` view.

Reports set an arm's round-1 mean beside the published pools that played the same game, and mark
the pool of the arm's own model (``model_match``, a regular expression on the arm's model name).
Only figures read in, or computed from, the cited source are listed; docs/warehouse.md says how.
The seed paper's own figures (arXiv 2407.17789) are not listed: none could be read in a source yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from warehouse.references import sql_values

_GAMA_COMMIT = "41ebccf54869a462a1ba3820d6c616e02e3f6fd1"
_GAMA_SOURCE = "GAMA-Bench (Huang et al. 2025)"
_GAMA_CITATION = (
    "Huang, Li, Lam, Liang, Wang, Yuan, Jiao, Wang, Tu & Lyu (2025), How Far Are We on the Decision-Making of "
    "LLMs? Evaluating LLMs' Gaming Ability in Multi-Agent Environments, ICLR 2025, arXiv 2403.11807; "
    f"raw results: github.com/CUHK-ARISE/GAMABench at commit {_GAMA_COMMIT[:7]}"
)
_GAMA_URL = f"https://github.com/CUHK-ARISE/GAMABench/tree/{_GAMA_COMMIT}/raw_results/guessing_game"
_GAMA_SETTING = ("10 players × 20 rounds, integers in [0, 100], direct answer as JSON (no chain of thought), "
                 "an invalid answer asked again; 5 games")


@dataclass(frozen=True)
class LLMReference:
    """One published result of an LLM pool: ``statistic`` (``mean``) of its guesses in ``round``.

    ``model`` is the name the source prints, ``model_id`` the model its records name, and
    ``model_match`` a case-insensitive regular expression that an arm's model name matches when it
    is the same model. ``run_means`` are the per-game values that ``value`` pools (``n`` guesses).
    """

    source: str
    citation: str
    url: str
    model: str
    model_id: str
    model_match: str
    prompt_mode: str
    setting: str
    players: int
    runs: int
    ratio: str
    offset: float
    low: float
    high: float
    round: int
    statistic: str
    value: float
    n: int
    run_means: tuple[float, ...]
    derivation: str


def _gama(model: str, model_id: str, match: str, prefix: str, run_means: tuple[float, ...], total: int, value: float) -> LLMReference:
    """A GAMA-Bench round-1 mean: 5 games of 10 players, from ``<prefix>guessing_game_v1_{1..5}.json``."""
    derivation = (f"round 1 of raw_results/guessing_game/{prefix}guessing_game_v1_{{1..5}}.json: game means "
                  f"{', '.join(f'{m:g}' for m in run_means)}; sum of the 50 guesses {total} / 50 = {value:g}")
    return LLMReference(_GAMA_SOURCE, _GAMA_CITATION, _GAMA_URL, model, model_id, match, "basic", _GAMA_SETTING,
                        10, 5, "2/3", 0.0, 0.0, 100.0, 1, "mean", value, 50, tuple(map(float, run_means)), derivation)


LLM_REFERENCE: list[LLMReference] = [
    # GAMA-Bench's guessing game (prompt v1, the leaderboard's runs): round 1 of its five games per model,
    # each file's round_records[0].responses; model_id is player_data[*].model in those files.
    _gama("Gemini-1.5-Pro", "gemini-1.5-pro", r"gemini-1\.5-pro\b", "gemini-1.5-pro_", (24.5, 27.4, 29.9, 32.4, 32), 1462, 29.24),
    _gama("GPT-4o", "gpt-4o", r"(^|/)gpt-4o(-\d{4}-\d{2}-\d{2})?$", "gpt-4o_", (28.6, 29.4, 30, 31.9, 31.4), 1513, 30.26),
    _gama("Mixtral-8x22B", "mistralai/Mixtral-8x22B-Instruct-v0.1", r"mixtral-8x22b\b", "mixtral-8x22b_",
          (34.1, 31.9, 33.2, 34, 33.5), 1667, 33.34),
    _gama("LLaMA-3.1-405B", "meta-llama/Meta-Llama-3.1-405B-Instruct", r"llama-3\.1-405b\b", "llama-3.1-405b_",
          (31.9, 36.8, 33.6, 38.1, 36.9), 1773, 35.46),
    _gama("Mixtral-8x7B", "mistralai/Mixtral-8x7B-Instruct-v0.1", r"mixtral-8x7b\b", "mixtral-8x7b_",
          (43.1, 40.1, 38.5, 38, 40.4), 2001, 40.02),
    _gama("Qwen-2-72B", "Qwen/Qwen2-72B-Instruct", r"qwen-?2-72b\b", "qwen2-72b_", (48, 35, 44.6, 36.3, 36.4), 2003, 40.06),
    _gama("LLaMA-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct", r"llama-3\.1-70b\b", "llama-3.1-70b_",
          (40.3, 38.7, 42.8, 43.9, 38), 2037, 40.74),
    _gama("GPT-4-0125", "gpt-4-0125-preview", r"gpt-4-0125\b", "gpt-4-0125-preview_", (41.6, 36.3, 48.3, 41.6, 42.7), 2105, 42.1),
    _gama("LLaMA-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct", r"llama-3\.1-8b\b", "llama-3.1-8b_",
          (45.2, 49.2, 43.7, 46.1, 47.2), 2314, 46.28),
    # the files without a model prefix: every player's model is "gpt-3.5-turbo"
    _gama("GPT-3.5-Turbo", "gpt-3.5-turbo", r"(^|/)gpt-3\.5-turbo$", "", (50, 50, 50, 50, 50), 2500, 50.0),
    _gama("GPT-3.5-1106", "gpt-3.5-turbo-1106", r"gpt-3\.5-turbo-1106\b", "gpt-3.5-turbo-1106_", (50, 50, 50, 50, 50), 2500, 50.0),
    _gama("GPT-3.5-0613", "gpt-3.5-turbo-0613", r"gpt-3\.5-turbo-0613\b", "gpt-3.5-turbo-0613_", (50, 50, 50, 50, 50), 2500, 50.0),
    _gama("Gemini-1.0-Pro", "gemini-1.0-pro", r"gemini-1\.0-pro\b", "gemini-1.0-pro_", (62.1, 59.5, 58.4, 59.8, 59.3), 2991, 59.82),
]

#: Columns of the view, in order.
COLUMNS = ("source", "citation", "url", "model", "model_id", "model_match", "prompt_mode", "setting", "players", "runs",
           "ratio", "offset", "low", "high", "round", "statistic", "value", "n", "run_means", "derivation")


def values_sql() -> str:
    """The rows as a SQL ``VALUES`` list, in the column order of ``COLUMNS``."""
    return sql_values(LLM_REFERENCE, COLUMNS)
