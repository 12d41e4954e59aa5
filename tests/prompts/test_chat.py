"""The chat format's pure parts: where a prompt splits, how a template is rendered and hashed."""

from __future__ import annotations

import hashlib

import pytest

from prompts.chat import ChatTemplate, split_cue, split_cues

pytestmark = pytest.mark.quick

CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_last_line_is_the_cue():
    assert split_cue("Rules.\n\nAnswer with a single number.\nMy number is:") == ("Rules.\n\nAnswer with a single number.", "My number is:")
    assert split_cue("one line") == ("one line", "")
    assert split_cues(["a\nb", "a\nb", "c"]) == (["a", "a", "c"], ["b", "b", ""])


def test_render_opens_the_assistant_turn_with_the_opening():
    template = ChatTemplate(CHATML, bos_token="<s>")
    assert template.render("Rules.", "My number is:") == (
        "<s><|im_start|>user\nRules.<|im_end|>\n<|im_start|>assistant\nMy number is:"
    )
    assert template.render_all(["a", "a"], ["x", "y"]) == [template.render("a", "x"), template.render("a", "y")]
    assert template.sha256 == hashlib.sha256(CHATML.encode()).hexdigest()


def test_a_template_that_raises_names_itself():
    template = ChatTemplate("{{ raise_exception('system messages only') }}")
    with pytest.raises(ValueError, match="^chat template: system messages only$"):
        template.render("hi")
