"""Running: a model built from what was read and run on images, its attention captured (the reference models, live modules, load)."""
