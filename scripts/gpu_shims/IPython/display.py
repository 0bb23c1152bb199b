"""``HTML`` and ``display`` as SGLang's notebook helpers call them, printing the text (no notebook here)."""


class HTML:
    def __init__(self, data=None, *args, **kwargs):
        self.data = data


def display(*objs, **kwargs):
    for obj in objs:
        print(getattr(obj, "data", obj))
