"""snip inside other training frameworks.

    planner.integrations.torchtitan   a torchtitan model converter (SnipLinearConverter) and a trainer
                                      that re-plans between steps (SnipTrainer)
    planner.integrations.hf_trainer   a Hugging Face `transformers.Trainer` callback (SnipCallback)

Each submodule imports its framework; `import planner` imports none of them, so snip works without
torchtitan or transformers installed.
"""
