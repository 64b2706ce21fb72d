"""The token routes' request bodies (vLLM's /tokenize and /detokenize, text-embeddings-inference's /tokenize and
/decode), beside the other requests' (ivy.schemas); served by ivy.routes_tokenize."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PlainValidator, WithJsonSchema, model_validator

from ivy.inputs import _ID_LISTS, _all_ints, _count, _first_not_int, _wrong, one_text, parse_texts
from ivy.schemas import _Request


class TokenizeRequest(_Request):
    """vLLM's /tokenize: the token ids of one text, never truncated."""

    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = Field(default=False, description=(
        "vLLM's: also answer `token_strs`, each id's token as the vocabulary writes it (null otherwise)."))


class TeiTokenizeRequest(_Request):
    """text-embeddings-inference's /tokenize (a body with `inputs` and no `prompt`): each text's tokens with their
    text, special flag and UTF-8 byte offsets, never truncated, a list per text."""

    inputs: Annotated[list[str], PlainValidator(lambda v: parse_texts(v, "inputs")), WithJsonSchema(
        {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string", "minLength": 1}}]})]
    add_special_tokens: bool = True
    prompt_name: str | None = Field(default=None, description=(
        "A sentence-transformers prompt of the model, prepended to every text (its tokens and offsets included); "
        "omitted = the model's default prompt, if any."))

    @model_validator(mode="before")
    @classmethod
    def _strings_only(cls, data: Any) -> Any:
        """TEI's `inputs` list holds strings only (parse_texts would take {"text": ...} objects too): counted
        first, then each item checked in order, errors naming inputs[i]."""
        items = data.get("inputs") if isinstance(data, dict) else None
        if isinstance(items, list) and items:
            _count(len(items), "inputs")
            for i, item in enumerate(items):
                one_text(item, f"inputs[{i}]")
        return data


class DetokenizeRequest(_Request):
    """vLLM's /detokenize: the text of token ids, special tokens kept (as vLLM's tokenizer.decode does)."""

    tokens: list[int]


def _id_lists(value: Any) -> list[list[int]] | list[int]:
    """One list of token ids or a list of them; an error names the element (ids[1][3]). Checked in C, a few
    calls per list (on the event loop: a Python test per id held it ~180 ms for 2 MB of ids)."""
    if not isinstance(value, list):
        raise _wrong("ids", "a list of token ids or a list of such lists")
    if not (value and isinstance(value[0], list)):
        if not _all_ints(value):
            raise _wrong(f"ids[{_first_not_int(value)}]", "a token id (an integer)")
        return value
    _count(len(value), "ids")
    for i, item in enumerate(value):
        if not isinstance(item, list):
            raise _wrong(f"ids[{i}]", "a list of token ids, as ids[0] is")
        if not _all_ints(item):
            raise _wrong(f"ids[{i}][{_first_not_int(item)}]", "a token id (an integer)")
    return value


class DecodeRequest(_Request):
    """text-embeddings-inference's /decode: the text of one id list or of several, answered as a list."""

    ids: Annotated[list, PlainValidator(_id_lists), WithJsonSchema({"anyOf": [
        {"type": "array", "items": {"type": "integer"}}, _ID_LISTS]})]
    skip_special_tokens: bool = True
