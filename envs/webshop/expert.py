"""A scripted shopper that knows the goal: the oracle behind `WebShopEnv.scripted_action`.

It searches the instruction, opens the goal product when it is on the first `MAX_RESULT_PAGES`
result pages (else goes back and searches the goal product's title instead), selects each goal
option and buys. It never clicks another product, so when search finds the goal it earns 1.0.
"""

from __future__ import annotations

from envs.webshop import pages
from envs.webshop.goals import Goal
from envs.webshop.page_text import Page, normalise_label

MAX_RESULT_PAGES = 3


def _click(label: str) -> str:
    return f"<answer>click[{label}]</answer>"


def asked_option_click(page: Page, goal: Goal) -> str | None:
    """A click on the first option value the goal asks for that `page` offers and has not selected
    yet; None when there is none left."""
    for value in goal.options.values():
        if normalise_label(value) in page.clickables and value not in page.selected:
            return _click(value)
    return None


def expert_action(page: Page, goal: Goal, goal_title: str, num_searches: int) -> str | None:
    """The expert's answer text on `page`, after `num_searches` searches; None once bought."""
    kind = page.data.get("page")
    if kind == "search":
        query = goal.instruction if num_searches == 0 else goal_title
        return f"<answer>search[{query}]</answer>"
    if kind == "results":
        if normalise_label(goal.asin) in page.clickables:
            return _click(goal.asin)
        page_num = int(page.data.get("page-num", "1"))
        if normalise_label(pages.NEXT) in page.clickables and page_num < MAX_RESULT_PAGES:
            return _click(pages.NEXT)
        return _click(pages.BACK_TO_SEARCH)
    if kind == "item":
        if page.data.get("asin") != goal.asin:
            return _click(pages.PREV)
        return asked_option_click(page, goal) or _click(pages.BUY_NOW)
    if kind in pages.SUB_PAGES:
        return _click(pages.PREV)
    return None
