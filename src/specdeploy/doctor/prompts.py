"""The probe's built-in prompts: four categories (code, math, chat, translation) in English and Chinese.

Written for this project. Two prompts per group keep the probe short; a group's tau is over all its verify
steps, so a group with long answers weighs by its steps, not by its prompt count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbePrompt:
    category: str  # code, math, chat, translation
    language: str  # en, zh
    text: str

    @property
    def group(self) -> str:
        return f"{self.category}/{self.language}"


PROBE_PROMPTS: tuple[ProbePrompt, ...] = (
    ProbePrompt(
        "code",
        "en",
        'def moving_average(values, window):\n    """Return the averages of every run of `window` consecutive '
        'values."""\n',
    ),
    ProbePrompt(
        "code",
        "en",
        "class LRUCache:\n    def __init__(self, capacity):\n        self.capacity = capacity\n"
        "        self.items = {}\n\n    def get(self, key):\n",
    ),
    ProbePrompt(
        "code",
        "zh",
        'def 合并区间(区间列表):\n    """合并所有重叠的区间，返回按起点排序的新列表。"""\n',
    ),
    ProbePrompt(
        "code",
        "zh",
        "# 读取配置文件，返回一个字典\ndef 读取配置(路径):\n    结果 = {}\n    with open(路径, encoding='utf-8') as f:\n",
    ),
    ProbePrompt(
        "math",
        "en",
        "A train leaves at 9:40 and travels 210 km at 84 km/h. At what time does it arrive? "
        "Solve it step by step.",
    ),
    ProbePrompt(
        "math",
        "en",
        "Find all real x with x^2 - 5x + 6 = 0, and check each answer by substituting it back.",
    ),
    ProbePrompt(
        "math",
        "zh",
        "一列火车九点四十分出发，以每小时84公里的速度行驶210公里。它几点到达？请一步一步地解答。",
    ),
    ProbePrompt("math", "zh", "求满足 x^2 - 5x + 6 = 0 的所有实数 x，并把每个解代回原方程检验。"),
    ProbePrompt(
        "chat",
        "en",
        "I have a week off in October and a small budget. Suggest a plan for a quiet trip by train, "
        "with one idea for each day.",
    ),
    ProbePrompt(
        "chat",
        "en",
        "Write a short, friendly note to a neighbour asking them to water my plants while I am away.",
    ),
    ProbePrompt("chat", "zh", "我十月份有一周假期，预算不多。请帮我规划一次安静的火车旅行，每天给一个建议。"),
    ProbePrompt("chat", "zh", "帮我写一张简短友好的便条，请邻居在我外出时帮我浇花。"),
    ProbePrompt(
        "translation",
        "en",
        "Translate into Chinese: The library opens at nine in the morning and closes at six in the evening; "
        "on Sundays it is closed.",
    ),
    ProbePrompt(
        "translation",
        "en",
        "Translate into Chinese: Please keep your ticket until the end of the journey.",
    ),
    ProbePrompt("translation", "zh", "翻译成英文：图书馆早上九点开门，晚上六点关门，星期日闭馆。"),
    ProbePrompt("translation", "zh", "翻译成英文：请保留车票直到旅程结束。"),
)
