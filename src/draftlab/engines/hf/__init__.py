"""transformers' own generate(), plain and assisted, as a peer of our loop."""
