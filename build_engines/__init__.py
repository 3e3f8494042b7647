"""The engine-build pipeline (``sluice build-engine``): a checkpoint in the weight store -> an artifact
with a manifest -> a staged registry version. Imports only the shared core (``sluice``); see README.md."""
