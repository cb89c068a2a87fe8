"""Report layer: HTML / Markdown from analysis results (docs/design.md "Layers"). Renders only:
figure data comes from `rlbatch.analysis.figures`; matplotlib is imported lazily (Agg).

- `inputs`: profile.json and/or run directories -> analysis document, run frames, profile.
- `plots`: one matplotlib renderer per figure -> PNG bytes.
- `text`: numbers, sentences and table cells (unescaped).
- `html`, `markdown`: the page (every string from configs and logs escaped).
- `build`: `build_report(paths, output, fmt)` (`rlbatch report`).

See docs/report.md.
"""
