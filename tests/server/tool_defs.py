"""The two functions the tool-calling tests offer the demo model, and the question that calls for them.

Their schemas are tight (a short city, 1 to 7 days, one of two time zones) so a constrained call is
checkable argument by argument.
"""

from __future__ import annotations

ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"tz": {"enum": ["UTC", "CET"]}},
        "required": ["tz"],
        "additionalProperties": False,
    },
}
TOOLS = [{"type": "function", "function": f} for f in (WEATHER, TIME)]
