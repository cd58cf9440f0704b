"""What every method stands on: RoPE and where it sits in a model, the curves, the scales file, model
loading, and the table of scalings. Imports nothing above it."""
