"""The decorator on methods, classmethods and staticmethods (sync and
async), and its refusal of generator functions.

A method's self (a classmethod's cls) is not an argument of the request:
it is left out of the fingerprint, so that the other arguments make it,
and a key callable or tenant callable can still read it (a["self"]).
Every case counts the effects and checks the values each call got back.
"""
import asyncio
import inspect

import pytest

import idem
from helpers import records


class Shop:
    """Decorated methods, on a store and an operation given: a shop counts
    its orders, and each effect is a line in effects."""

    def __init__(self, store, operation, effects, name="shop-1"):
        self.name = name
        self.effects = effects
        self.orders = 0


def pairs(outs):
    return [(o.value, o.replayed) for o in outs]


def test_a_method_runs_once_per_key_without_self_in_the_fingerprint(store, operation,
                                                                     effects):
    class Orders(Shop):
        @store.idempotent(operation, key="request_id")
        def order(self, item, request_id):
            self.orders += 1
            self.effects.add("method %s %s %s" % (self.name, item, request_id))
            return {"order": self.orders, "item": item, "shop": self.name}

    shop = Orders(store, operation, effects)
    first = shop.order.outcome("book", "r-1")
    again = shop.order.outcome("book", request_id="r-1")
    value = shop.order("book", "r-1")
    # Another instance with the same key and arguments: the same request.
    other = Orders(store, operation, effects, name="shop-2")
    other_out = other.order.outcome("book", "r-1")
    # Through the class, self given.
    via_class = Orders.order(shop, "book", "r-1")
    via_class_out = Orders.order.outcome(other, "book", "r-1")
    assert pairs([first, again, other_out, via_class_out]) == [
        ({"order": 1, "item": "book", "shop": "shop-1"}, False),
        ({"order": 1, "item": "book", "shop": "shop-1"}, True),
        ({"order": 1, "item": "book", "shop": "shop-1"}, True),
        ({"order": 1, "item": "book", "shop": "shop-1"}, True)]
    assert value == via_class == first.value
    # The other arguments still make the fingerprint.
    with pytest.raises(idem.Conflict):
        shop.order("pen", "r-1")
    second = shop.order.outcome("pen", "r-2")
    assert pairs([second]) == [({"order": 2, "item": "pen", "shop": "shop-1"}, False)]
    assert effects.lines() == ["method shop-1 book r-1", "method shop-1 pen r-2"]
    assert (shop.orders, other.orders) == (2, 0)
    assert sorted(r["key"] for r in records(store.url, operation)) == ["r-1", "r-2"]
    # It still looks like the method it decorates.
    assert shop.order.__name__ == "order"
    assert Orders.order.__wrapped__.__qualname__.endswith("Orders.order")


def test_an_async_method(store, operation, effects):
    class Orders(Shop):
        @store.idempotent(operation, key="request_id")
        async def order(self, item, request_id):
            await asyncio.sleep(0)
            self.orders += 1
            self.effects.add("amethod %s %s %s" % (self.name, item, request_id))
            return {"order": self.orders, "item": item, "shop": self.name}

    shop = Orders(store, operation, effects)
    assert inspect.iscoroutinefunction(shop.order)
    assert inspect.iscoroutinefunction(Orders.order)

    async def main():
        return [await shop.order.outcome("book", "r-1"),
                await shop.order.outcome("book", "r-1"),
                await Orders(store, operation, effects, "shop-2").order.outcome("book", "r-1"),
                await shop.order.outcome("pen", "r-2"),
                await shop.order("book", "r-1")]

    outs = asyncio.run(asyncio.wait_for(main(), 30))
    assert pairs(outs[:4]) == [({"order": 1, "item": "book", "shop": "shop-1"}, False),
                               ({"order": 1, "item": "book", "shop": "shop-1"}, True),
                               ({"order": 1, "item": "book", "shop": "shop-1"}, True),
                               ({"order": 2, "item": "pen", "shop": "shop-1"}, False)]
    assert outs[4] == outs[0].value

    async def conflict():
        await shop.order("pen", "r-1")

    with pytest.raises(idem.Conflict):
        asyncio.run(conflict())
    assert effects.lines() == ["amethod shop-1 book r-1", "amethod shop-1 pen r-2"]
    assert shop.orders == 2


def test_a_method_keyed_by_an_attribute_of_self(store, operation, effects):
    class Orders(Shop):
        # Each shop's request ids are its own: the tenant is self.name.
        @store.idempotent(operation, key="request_id", tenant=lambda a: a["self"].name)
        def order(self, item, request_id):
            self.orders += 1
            self.effects.add("shop %s %s %s" % (self.name, item, request_id))
            return {"order": self.orders, "shop": self.name}

        # The key made of an attribute of self and an argument.
        @store.idempotent(operation + "_keyed",
                          key=lambda a: "%s-%s" % (a["self"].name, a["number"]))
        def invoice(self, number, amount):
            self.effects.add("invoice %s %s" % (self.name, number))
            return {"invoice": "%s/%s" % (self.name, number), "amount": amount}

    one = Orders(store, operation, effects, name="shop-1")
    two = Orders(store, operation, effects, name="shop-2")
    outs = [one.order.outcome("book", "r-1"),
            two.order.outcome("book", "r-1"),   # another tenant
            one.order.outcome("book", "r-1"),
            two.order.outcome("book", "r-1")]
    assert pairs(outs) == [({"order": 1, "shop": "shop-1"}, False),
                           ({"order": 1, "shop": "shop-2"}, False),
                           ({"order": 1, "shop": "shop-1"}, True),
                           ({"order": 1, "shop": "shop-2"}, True)]
    assert [r["key"] for r in records(store.url, operation, "shop-1")] == ["r-1"]
    assert [r["key"] for r in records(store.url, operation, "shop-2")] == ["r-1"]
    invoices = [one.invoice.outcome(7, 100), two.invoice.outcome(7, 100),
                one.invoice.outcome(7, 100)]
    assert pairs(invoices) == [({"invoice": "shop-1/7", "amount": 100}, False),
                               ({"invoice": "shop-2/7", "amount": 100}, False),
                               ({"invoice": "shop-1/7", "amount": 100}, True)]
    assert sorted(r["key"] for r in records(store.url, operation + "_keyed")) == [
        "shop-1-7", "shop-2-7"]
    assert effects.lines() == ["shop shop-1 book r-1", "shop shop-2 book r-1",
                               "invoice shop-1 7", "invoice shop-2 7"]


def classmethods(store, operation, effects):
    """A class with a classmethod decorated each way: classmethod above the
    decorator and below it (the first argument then named otherwise)."""
    class Kits:
        made = []

        @classmethod
        @store.idempotent(operation + "_below", key="request_id")
        def made_below(cls, item, request_id):
            cls.made.append(item)
            effects.add("below %s %s %s" % (cls.__name__, item, request_id))
            return {"made": len(cls.made), "by": cls.__name__}

        @store.idempotent(operation + "_above", key="request_id")
        @classmethod
        def made_above(klass, item, request_id):
            klass.made.append(item)
            effects.add("above %s %s %s" % (klass.__name__, item, request_id))
            return {"made": len(klass.made), "by": klass.__name__}
    return Kits


@pytest.mark.parametrize("where", ["below", "above"])
def test_a_classmethod(store, operation, effects, where):
    Kits = classmethods(store, operation, effects)
    made = getattr(Kits, "made_" + where)
    outs = [made.outcome("kit", "r-1"),
            getattr(Kits(), "made_" + where).outcome("kit", "r-1"),   # through an instance
            made.outcome("box", "r-2")]
    assert pairs(outs) == [({"made": 1, "by": "Kits"}, False),
                           ({"made": 1, "by": "Kits"}, True),
                           ({"made": 2, "by": "Kits"}, False)]
    assert made("kit", "r-1") == {"made": 1, "by": "Kits"}
    with pytest.raises(idem.Conflict):
        made("box", "r-1")
    assert Kits.made == ["kit", "box"]
    assert effects.lines() == ["%s Kits kit r-1" % where, "%s Kits box r-2" % where]
    assert sorted(r["key"] for r in records(store.url, operation + "_" + where)) == [
        "r-1", "r-2"]


@pytest.mark.parametrize("where", ["below", "above"])
def test_an_async_classmethod(store, operation, effects, where):
    class Kits:
        made = []

        if where == "below":
            @classmethod
            @store.idempotent(operation, key="request_id")
            async def make(cls, item, request_id):
                await asyncio.sleep(0)
                cls.made.append(item)
                effects.add("acm %s %s %s" % (cls.__name__, item, request_id))
                return {"made": len(cls.made), "by": cls.__name__}
        else:
            @store.idempotent(operation, key="request_id")
            @classmethod
            async def make(cls, item, request_id):
                await asyncio.sleep(0)
                cls.made.append(item)
                effects.add("acm %s %s %s" % (cls.__name__, item, request_id))
                return {"made": len(cls.made), "by": cls.__name__}

    assert inspect.iscoroutinefunction(Kits.make)

    async def main():
        return [await Kits.make.outcome("kit", "r-1"),
                await Kits().make.outcome("kit", "r-1"),
                await Kits.make.outcome("box", "r-2")]

    outs = asyncio.run(asyncio.wait_for(main(), 30))
    assert pairs(outs) == [({"made": 1, "by": "Kits"}, False),
                           ({"made": 1, "by": "Kits"}, True),
                           ({"made": 2, "by": "Kits"}, False)]
    assert Kits.made == ["kit", "box"]
    assert effects.lines() == ["acm Kits kit r-1", "acm Kits box r-2"]


def staticmethods(store, operation, effects):
    class Prices:
        @staticmethod
        @store.idempotent(operation + "_below", key="request_id")
        def price_below(item, request_id):
            effects.add("below %s %s" % (item, request_id))
            return {"price": len(item)}

        @store.idempotent(operation + "_above", key="request_id")
        @staticmethod
        def price_above(item, request_id):
            effects.add("above %s %s" % (item, request_id))
            return {"price": len(item)}
    return Prices


@pytest.mark.parametrize("where", ["below", "above"])
def test_a_staticmethod(store, operation, effects, where):
    Prices = staticmethods(store, operation, effects)
    name = "price_" + where
    outs = [getattr(Prices, name).outcome("book", "r-1"),
            getattr(Prices(), name).outcome("book", "r-1"),
            getattr(Prices, name).outcome("pencil", "r-2")]
    assert pairs(outs) == [({"price": 4}, False), ({"price": 4}, True),
                           ({"price": 6}, False)]
    assert getattr(Prices(), name)("book", "r-1") == getattr(Prices, name)("book", "r-1") \
        == {"price": 4}
    # Every argument makes the fingerprint: none is taken for self.
    with pytest.raises(idem.Conflict):
        getattr(Prices, name)("pen", "r-1")
    assert effects.lines() == ["%s book r-1" % where, "%s pencil r-2" % where]


@pytest.mark.parametrize("where", ["below", "above"])
def test_an_async_staticmethod(store, operation, effects, where):
    class Prices:
        if where == "below":
            @staticmethod
            @store.idempotent(operation, key="request_id")
            async def price(item, request_id):
                await asyncio.sleep(0)
                effects.add("asm %s %s" % (item, request_id))
                return {"price": len(item)}
        else:
            @store.idempotent(operation, key="request_id")
            @staticmethod
            async def price(item, request_id):
                await asyncio.sleep(0)
                effects.add("asm %s %s" % (item, request_id))
                return {"price": len(item)}

    assert inspect.iscoroutinefunction(Prices.price)

    async def main():
        return [await Prices.price.outcome("book", "r-1"),
                await Prices().price.outcome("book", "r-1"),
                await Prices.price.outcome("pencil", "r-2")]

    outs = asyncio.run(asyncio.wait_for(main(), 30))
    assert pairs(outs) == [({"price": 4}, False), ({"price": 4}, True),
                           ({"price": 6}, False)]
    assert effects.lines() == ["asm book r-1", "asm pencil r-2"]


def test_a_function_with_a_first_argument_named_self_is_not_a_method(store, operation,
                                                                     effects):
    # Outside a class body, an argument named self is an argument like the
    # others: it makes the fingerprint.
    @store.idempotent(operation, key="request_id")
    def note(self, request_id):
        effects.add("note %s %s" % (self, request_id))
        return {"self": self}

    assert pairs([note.outcome("a", "r-1"), note.outcome("a", "r-1")]) == [
        ({"self": "a"}, False), ({"self": "a"}, True)]
    with pytest.raises(idem.Conflict):
        note("b", "r-1")
    assert effects.lines() == ["note a r-1"]


# --- Generators ----------------------------------------------------------------


def test_a_generator_function_is_refused_at_decoration(store, operation, effects):
    def tickets(n, request_id):
        effects.add("generator ran")
        yield {"ticket": n}

    with pytest.raises(TypeError, match="generator function"):
        store.idempotent(operation, key="request_id")(tickets)
    # Nothing ran, nothing was claimed.
    assert effects.lines() == []
    assert records(store.url, operation) == []
    # Its finished result decorates fine.
    collect = store.idempotent(operation, key="request_id")(
        lambda n, request_id: list(tickets(n, request_id)))
    assert pairs([collect.outcome(1, "r-1"), collect.outcome(1, "r-1")]) == [
        ([{"ticket": 1}], False), ([{"ticket": 1}], True)]
    assert effects.lines() == ["generator ran"]


def test_an_async_generator_function_is_refused_at_decoration(store, operation, effects):
    async def tickets(n, request_id):
        effects.add("generator ran")
        yield {"ticket": n}

    with pytest.raises(TypeError, match="async generator function"):
        store.idempotent(operation, key="request_id")(tickets)

    class Feed:
        @staticmethod
        async def items(request_id):
            yield 1

    with pytest.raises(TypeError, match="async generator function"):
        store.idempotent(operation, key="request_id")(Feed.__dict__["items"])
    assert effects.lines() == []
    assert records(store.url, operation) == []


@pytest.mark.parametrize("kind", ["generator", "async generator", "coroutine"])
def test_execute_refuses_an_action_that_would_not_run(store, operation, effects, kind):
    # Calling such an action only makes a generator (or a coroutine): its
    # body would run later, or never, outside the call that holds the key,
    # and the key would be marked unknown with nothing done.
    if kind == "generator":
        def action():
            effects.add("ran")
            yield {"ticket": 1}
    elif kind == "async generator":
        async def action():
            effects.add("ran")
            yield {"ticket": 1}
    else:
        async def action():
            effects.add("ran")
            return {"ticket": 1}

    with pytest.raises(TypeError, match="is an? %s function" % kind):
        store.execute(operation, "k-1", {"n": 1}, action)
    assert effects.lines() == []
    assert records(store.url, operation) == []
    # The key is untouched: a finished action under it acts.
    out = store.execute(operation, "k-1", {"n": 1}, lambda: effects.add("ran") or [1])
    assert (out.value, out.replayed) == ([1], False)
    assert effects.lines() == ["ran"]
