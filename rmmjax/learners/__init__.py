"""The learners: each reranker family in one place, its pure model beside how its inputs are
built. The core's selection, log-probability, losses and steps see only a learner's scores."""
