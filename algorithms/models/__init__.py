"""Models: the personal models (a backbone of the peer's choice, a head, a projector, prototypes),
the small shared model, the losses, local training, where a model runs and putting it to use."""
