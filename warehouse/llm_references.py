"""Published results of LLM players, each row with its source and citation, for the ``llm_reference`` view.

Reports set an arm's round-1 mean beside the published pools that played the same game, and its
round means beside the seed paper's (arXiv 2407.17789v2) for the same prompt mode and round, marking
the pools of the arm's own model (``model_match``, a regular expression on the arm's model name).
Only figures read in, or computed from, the cited source are listed; docs/warehouse.md says how.
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

    ``model`` is the name the source prints, ``model_id`` the model its records name (None: it
    names no checkpoint), and ``model_match`` a case-insensitive regular expression that an arm's
    model name matches when it is the same model. ``run_means`` are the per-game values that
    ``value`` pools (``n`` guesses). None in ``runs``, ``n`` or ``run_means``: the source does not
    state it (``derivation`` says so).
    """

    source: str
    citation: str
    url: str
    model: str
    model_id: str | None
    model_match: str
    prompt_mode: str
    setting: str
    players: int
    runs: int | None
    ratio: str
    offset: float
    low: float
    high: float
    round: int
    statistic: str
    value: float
    n: int | None
    run_means: tuple[float, ...] | None
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

#: The seed paper, whose experiments keynes follows: its guessing-game figures as printed.
PAPER_SOURCE = "AgentScope paper (Pan et al. 2024)"
#: How a page names it in a sentence.
PAPER_SHORT = "Pan et al. 2024, arXiv 2407.17789v2"
_PAPER_CITATION = ("Pan, Gao, Xie, Chen, Wei, Li, Ding, Wen & Zhou (2024), Very Large-Scale Multi-Agent Simulation "
                   "in AgentScope, arXiv 2407.17789v2")
_PAPER_URL = "https://arxiv.org/abs/2407.17789v2"
#: keynes's prompt mode → the paper's prompt, and what it adds to the rules.
PAPER_PROMPTS = {"basic": ("P1", "directly report your number"), "cot": ("P2", "think step by step, then report your number"),
                 "cot_rational": ("P3", "P2 + all players are rational"),
                 "cot_strategic": ("P4", "P2 + try to guess others' strategies")}
#: Round-1 average guess of the paper's models × prompts experiment, P1 … P4, by the name it prints and
#: a pattern of that model's usual served names (Hugging Face, Ollama, GGUF files).
_PAPER_ROUND_ONE = {
    ("Llama3-8B", r"llama-?3[-:_]?8b\b"): (55.89, 49.85, 47.84, 47.09),
    ("Llama3-70B", r"llama-?3[-:_]?70b\b"): (50.30, 34.18, 36.11, 17.15),
    ("MistralAI-8x7B", r"(mixtral|mistralai)[-:]8x7b\b"): (36.63, 37.57, 35.19, 24.42),
    ("MistralAI-8x22B", r"(mixtral|mistralai)[-:]8x22b\b"): (31.69, 19.89, 7.62, 7.94),
    ("Qwen2-7B", r"qwen-?2[-:]7b\b"): (66.96, 32.57, 26.45, 28.38),
    ("Qwen2-72B", r"qwen-?2[-:]72b\b"): (50.56, 19.15, 8.15, 8.85),
}
#: Average guess per round of the paper's five-round experiment (Qwen2-72B), by prompt mode.
_PAPER_FIVE_ROUNDS = {"basic": (50.56, 42.94, 35.30, 29.95, 25.16), "cot": (19.15, 11.06, 6.11, 3.43, 2.02)}
_FIVE_ROUND_MODEL = "Qwen2-72B"
#: The paper's models in the order it prints them.
PAPER_MODELS = tuple(model for model, _ in _PAPER_ROUND_ONE)
_FIVE_ROUND_MATCH = next(match for model, match in _PAPER_ROUND_ONE if model == _FIVE_ROUND_MODEL)


def _paper(model: str, match: str, mode: str, round_: int, value: float) -> LLMReference:
    """One average guess the seed paper prints: ``model`` under ``mode``'s prompt in ``round_``."""
    prompt, words = PAPER_PROMPTS[mode]
    five = model == _FIVE_ROUND_MODEL and mode in _PAPER_FIVE_ROUNDS
    experiment = ("its five-round experiment" if round_ > 1 else
                  "its models × prompts experiment (also round 1 of its five-round experiment)" if five else
                  "its models × prompts experiment")
    setting = (f"1,000 agents{' × 5 rounds' if round_ > 1 else ''}, integers in [0, 100], 2/3 of the average; "
               f"prompt {prompt}: the rules + {words}")
    derivation = (f"the average guess of {model} under {prompt} in round {round_} of {experiment}, as printed in "
                  "arXiv 2407.17789v2 (its table and page not recorded), not recomputed; the paper does not state how "
                  "many games it ran nor how many answers were valid: runs, n and run_means are NULL")
    return LLMReference(PAPER_SOURCE, _PAPER_CITATION, _PAPER_URL, model, None, match, mode, setting, 1000, None,
                        "2/3", 0.0, 0.0, 100.0, round_, "mean", value, None, None, derivation)


LLM_REFERENCE += [
    _paper(model, match, mode, 1, value)
    for (model, match), values in _PAPER_ROUND_ONE.items() for mode, value in zip(PAPER_PROMPTS, values)
] + [
    _paper(_FIVE_ROUND_MODEL, _FIVE_ROUND_MATCH, mode, round_, value)
    for mode, values in _PAPER_FIVE_ROUNDS.items() for round_, value in enumerate(values[1:], start=2)
]

#: Columns of the view, in order.
COLUMNS = ("source", "citation", "url", "model", "model_id", "model_match", "prompt_mode", "setting", "players", "runs",
           "ratio", "offset", "low", "high", "round", "statistic", "value", "n", "run_means", "derivation")


def values_sql() -> str:
    """The rows as a SQL ``VALUES`` list, in the column order of ``COLUMNS``."""
    return sql_values(LLM_REFERENCE, COLUMNS)
