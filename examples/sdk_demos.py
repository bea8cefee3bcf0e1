"""What the SDK and framework demos need, against `fleetgate up` (simulated engines behind the gateway).

    fleetgate up                                  # in one terminal
    python examples/sdk_demos.py [BASE_URL] [API_KEY]    # default http://127.0.0.1:8080, no key

Structured output with the openai SDK (`chat.completions.parse`), a tool call streamed as deltas, and the
same with LangChain (`with_structured_output`, `bind_tools`) when `langchain-openai` is installed. The
simulated engine answers tools with a well-formed call and `response_format` with JSON that fits the schema
(docs/simengine.md), so these run without a GPU; against a real engine the same code runs unchanged.
"""

from __future__ import annotations

import json
import sys

import openai
from pydantic import BaseModel


class CalendarEvent(BaseModel):
    name: str
    date: str
    participants: list[str]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def main(base_url: str = "http://127.0.0.1:8080", api_key: str = "unused") -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key)
    model = client.models.list().data[0].id
    event = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Alice and Bob go to a science fair on Friday."}],
        response_format=CalendarEvent,
    )
    print("parse:", event.choices[0].message.parsed)
    name, args = "", ""
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        stream=True,
    )
    for chunk in stream:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if call.function is not None:
                name += call.function.name or ""
                args += call.function.arguments or ""
    print("tool call:", name, json.loads(args))
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        print("langchain: not installed (pip install langchain-openai)")
        return
    llm = ChatOpenAI(model=model, base_url=base_url + "/v1", api_key=api_key)  # type: ignore[arg-type]
    print("langchain structured:", llm.with_structured_output(CalendarEvent).invoke("Plan a meeting"))
    print("langchain tools:", llm.bind_tools([WEATHER]).invoke("Weather in Oslo?").tool_calls)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(*sys.argv[1:3])
