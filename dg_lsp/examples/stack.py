"""A small example for `dg-lsp complete`: the cursor goes at the end of line 17 (`return `)."""


class Stack:
    """A last-in, first-out stack of items."""

    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def peek(self):
        return 

    def is_empty(self):
        return len(self.items) == 0
