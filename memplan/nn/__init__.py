"""Training-side modules: memory-lean autograd ops (:mod:`.lean`), the choice of which one
replaces an op (:mod:`.choice`), architecture transforms (:mod:`.transforms`) and the one
training loop (:mod:`.train`)."""
