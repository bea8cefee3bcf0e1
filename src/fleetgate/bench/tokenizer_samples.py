"""Small prompts in four kinds of text for measuring token-count estimates (written for this project)."""

from __future__ import annotations

SAMPLES: dict[str, list[str]] = {
    "english": [
        "Summarise the quarterly report in three bullet points and flag any risk to the delivery dates.",
        "The gateway admits a request only when the tenant still has budget; otherwise it answers 429 "
        "with a Retry-After header, so well-behaved clients back off instead of hammering the fleet.",
        "Write a short, friendly reply to a customer who asks why their invoice doubled this month.",
        "Explain to a new engineer how prefix caching lets a long system prompt be computed once and "
        "reused by every later request that starts with the same tokens.",
    ],
    "code": [
        "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n"
        "        a, b = b, a + b\n    return a\n",
        "for (let i = 0; i < items.length; i++) {\n"
        "  if (items[i].price > 100) { total += items[i].price * 0.9; }\n}",
        "SELECT tenant, SUM(cost_mu) AS used FROM requests WHERE ts > now() - interval '1 hour' "
        "GROUP BY tenant ORDER BY used DESC LIMIT 10;",
        '#include <stdio.h>\nint main(void) {\n    printf("%d\\n", 6 * 7);\n    return 0;\n}\n',
    ],
    "german": [
        "Bitte fassen Sie den Quartalsbericht in drei Stichpunkten zusammen und nennen Sie alle Risiken.",
        "Die Straßenbahn fährt heute wegen Bauarbeiten nur bis zum Hauptbahnhof; danach verkehren "
        "Ersatzbusse im Zehnminutentakt.",
        "Schreiben Sie eine kurze, freundliche Antwort an eine Kundin, deren Rechnung sich verdoppelt hat.",
        "Geschwindigkeitsbegrenzungsschilder und Datenschutzgrundverordnung sind lange deutsche Wörter.",
    ],
    "chinese": [
        "请用三个要点总结季度报告，并指出交付日期面临的所有风险。",
        "网关只有在租户仍有预算时才会接受请求，否则返回四二九并附带重试时间。",
        "请给一位询问本月账单为何翻倍的客户写一封简短友好的回复。",
        "向新工程师解释前缀缓存如何让很长的系统提示只计算一次，并被之后所有以相同内容开头的请求复用。",
    ],
}
