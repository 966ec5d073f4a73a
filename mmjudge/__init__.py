"""mmjudge: fine-tuned multimodal judge models: score, train, calibrate, serve.

The repository's top-level folders are this package's subpackages: judge/ (the core every command shares),
infer/ (judge-score), train/ (judge-train), calibration/ (judge-calibrate), serve/ (judge-serve), demo/
(judge-demo) and configs/ (rubrics and presets, as data)."""
