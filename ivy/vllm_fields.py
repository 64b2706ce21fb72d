"""vLLM's request fields that Ivy's embedding routes cannot honour, refused by name wherever vLLM's clients
send them (/pooling, /v1/embeddings and /embeddings), never silently ignored: vLLM takes `add_special_tokens`,
`embed_dtype` and chat `messages` on /v1/embeddings too (EmbeddingCompletionRequest and EmbeddingChatRequest,
vllm/entrypoints/pooling/embed/protocol.py), and an answer that ignored them would be the wrong vectors
(special tokens kept) or bytes the client decodes wrongly. vLLM's embed_dtypes and endiannesses are all
served (ivy.embed_dtypes.wire_dtype); other embedding APIs' fields are ivy.peer_fields'.
Messages name the field and what is served, never the value sent (ivy.errors)."""

from __future__ import annotations

from typing import Any

from ivy.errors import IvyError, Problem

# field -> (the values served, why the others are not); None (vLLM's default) is always served
SERVED: dict[str, tuple[tuple[Any, ...], str]] = {
    "encoding_format": (("float", "base64", "base64_int8", "base64_binary", "bytes", "bytes_only"),
                        "base64 and bytes carry float32, or embed_dtype's smaller floats, base64_int8 and "
                        "base64_binary Ivy's smaller encodings"),
    "embed_dtype": (("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"), "vLLM's base64 value types"),
    "padding": (("do_not_pad",), "inputs are embedded unpadded"),
    "add_special_tokens": ((True,), "texts are embedded with the model's special tokens; send token ids as input "
                                    "to choose every id yourself"),
}


def refuse(param: str, why: str, problem: Problem = Problem.INVALID_PARAMETER) -> IvyError:
    return IvyError(problem, f"{param}: {why}", param=param)


# what a body must hold for refuse_unserved to look further; encoding_format, which nearly every body holds (the
# openai client sends base64), is checked only with the others: its type refuses a format it does not list anyway
_ASKED = frozenset({"messages", "mm_processor_kwargs", *SERVED} - {"encoding_format"})


def refuse_unserved(data: dict, *, encoding_format: bool = False) -> None:
    """Raise for the first vLLM field of a raw body that asks for what Ivy cannot honour; one set test when the
    body has none of them (/v1/embeddings' hot path: 0.1 µs, against ~3 µs for the whole check on this VM).
    encoding_format: check that field's value too, even alone (/pooling names the formats it serves)."""
    if _ASKED.isdisjoint(data) and not (encoding_format and "encoding_format" in data):
        return
    if data.get("messages") is not None:
        raise refuse("messages", "chat input is not served (no chat template is applied); send the text, or its "
                                 "token ids, as input")
    if data.get("mm_processor_kwargs"):
        raise refuse("mm_processor_kwargs", "multimodal processing is not served; input is texts or token ids")
    for field, (served, why) in SERVED.items():
        value = data.get(field)
        if value is not None and not any(value == s and type(value) is type(s) for s in served):
            raise refuse(field, f"must be {' or '.join(_json(s) for s in served)}: {why}")


def _json(value: Any) -> str:
    return "true" if value is True else f'"{value}"'
