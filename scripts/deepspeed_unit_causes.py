"""Why each DeepSpeed unit test that fails on zerostream fails: (class, test-id regex,
message regex, cause). First match wins. Classes: "cuda" (no package passes it on a CPU),
"internal" (it reads a private DeepSpeed name, which the cause names), "failed" (the
package's fault, still to fix or refused by design; the cause says which)."""

CAUSES: list[tuple[str, str, str, str]] = []
