"""One P/D pair, measured turn by turn: TTFT against history (`ttft`), partial reuse
(`partial`), the three paths per suffix (`paths`) and what an idle engine costs (`idle`)."""
