"""A pickle reader for files that are not trusted: an interpreter, in
Python, of the opcodes of pickle protocols 0 to 5 (as ``pickletools``
documents them). It builds plain data itself (None, bools, numbers, str,
bytes, bytearray, tuples, lists, dicts, sets, frozensets) and leaves every
global, call, attribute update (BUILD) and persistent id to the methods a
subclass defines (loading.py's allow-list).

Unlike Python's own unpickler it never mutates (APPEND, SETITEM, ADDITEMS,
BUILD) an object it did not build in this load: not a class, a function,
an allowed global, nor a storage shared between tensors. The memo is a
dict (an index costs nothing until something is put there), nothing
recurses, and what a graph of shared memo references could cost is
bounded: a tuple or frozenset used as a dict key or set item (hashed and
compared, recursively, by Python) may hold at most ``MAX_KEY_LEAVES``
leaves counted as if expanded, and the result may nest at most
``MAX_DEPTH`` containers deep; all the keys together may hash at most 10
items per byte of the pickle. Extension codes and out-of-band buffers are
refused. Any problem raises ``Refused`` with the reason and the byte
offset; the caller names the file.
"""
import collections
import pickletools
import struct

MAX_KEY_LEAVES = 10_000
MAX_KEY_DEPTH = 100
MAX_DEPTH = 500
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}


class Refused(Exception):
    """Why a pickle is refused (the caller adds the file's name)."""


class _Foreign(Exception):  # noqa: N818 - a carrier, never seen outside this module
    """An exception of the loader's own code (a ``map_location`` callable, a
    missing GPU, a damaged storage record already naming the file): raised
    as it is, not as a problem of the pickle."""


def describe(obj):
    """A short, bounded description of an object from the file (never its
    full repr, which a graph of shared references could make enormous)."""
    if isinstance(obj, (bool, type(None), float)) or (
            type(obj) is int and obj.bit_length() < 128):
        return repr(obj)
    if type(obj) in (str, bytes):
        return repr(obj[:60]) + ("..." if len(obj) > 60 else "")
    if isinstance(obj, (tuple, list, dict, set, frozenset)):
        return f"a {type(obj).__name__} of {len(obj)} items"
    return f"a {type(obj).__name__}"


def short_error(error):
    """``Type: message`` of an exception an allowed call raised, bounded."""
    args = error.args
    text = args[0] if len(args) == 1 and isinstance(args[0], str) else ""
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


class Machine:
    """The state of one load (stack, marks, memo, what it built), the
    loop, and the checks every opcode goes through; the opcodes themselves
    are ``_opcodes.SafeUnpickler``'s methods ``_op_<NAME>``. A loader
    subclasses that and defines ``find_global``, ``call``, ``new``,
    ``build`` and ``persistent_load``."""

    def __init__(self, data, encoding="ASCII", max_objects=1 << 62):
        self._data, self._pos, self._encoding = data, 0, encoding
        self._objects_left = max_objects  # containers and call results, ~100 bytes each
        self._stack, self._metastack, self._memo = [], [], {}
        self._own = set()  # ids of the objects built in this load: the only ones mutated
        self._weights = {}  # id(tuple or frozenset) -> (leaves if expanded, nesting depth)
        self._keep = []  # everything in those two tables, so that ids stay unique
        self._hash_budget = 10 * len(data) + 100_000  # tuple-key items hashed, in all
        self._dispatch = {code: getattr(self, "_op_" + name) for code, name in _NAMES.items()
                          if hasattr(self, "_op_" + name)}

    # -- the policy: refuse everything unless a subclass admits it -------------
    def find_global(self, module, name):
        raise Refused(f"global {module[:100]}.{name[:100]} is not admitted")

    def call(self, func, args):
        raise Refused(f"calling {describe(func)} is not admitted")

    def new(self, cls, args, kwargs):
        raise Refused(f"creating {describe(cls)} through __new__ is not admitted")

    def build(self, obj, state):
        raise Refused(f"setting the state of {describe(obj)} is not admitted")

    def persistent_load(self, pid):
        raise Refused(f"persistent id {describe(pid)} is not admitted")

    # -- the loop ---------------------------------------------------------------
    def load(self):
        data, dispatch = self._data, self._dispatch
        while self._pos < len(data):
            start, code = self._pos, data[self._pos]
            self._pos += 1
            handler = dispatch.get(code)
            if handler is None:
                name = _NAMES.get(code)
                raise Refused(f"opcode {name or bytes([code])!r} at byte {start} " + (
                    "is not admitted" if name else "is not a pickle opcode"))
            try:
                done = handler()
            except Refused as e:
                raise Refused(f"{e} (opcode {_NAMES[code]} at byte {start})") from None
            except _Foreign as e:
                raise e.args[0]  # noqa: B904 - the original, with its own traceback
            except Exception as e:  # anything else the stream provoked is the file's problem
                raise Refused(f"{short_error(e)} (opcode {_NAMES[code]} at byte "
                              f"{start})") from None
            if done:
                result = self._pop()
                self._check_depth(result)
                return result
        raise Refused(f"the pickle ends at byte {len(data)} without its STOP opcode")

    # -- reading the stream ----------------------------------------------------
    def _take(self, n):
        end = self._pos + n
        if n < 0 or end > len(self._data):
            raise Refused(f"the pickle ends inside the opcode ({n} bytes wanted, "
                          f"{len(self._data) - self._pos} left)")
        chunk, self._pos = self._data[self._pos:end], end
        return chunk

    def _unpack(self, fmt):
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _line(self):
        end = self._data.find(b"\n", self._pos)
        if end < 0:
            raise Refused("the pickle ends inside a text opcode (no newline)")
        line, self._pos = self._data[self._pos:end], end + 1
        return line

    def _text_int(self, line):
        try:
            return int(line)
        except ValueError:
            raise Refused(f"{describe(line)} is not an integer") from None

    # -- the stack -------------------------------------------------------------
    def _pop(self):
        if not self._stack:
            raise Refused("it pops an empty stack")
        return self._stack.pop()

    def _top(self):
        if not self._stack:
            raise Refused("it needs an object on an empty stack")
        return self._stack[-1]

    def _pop_mark(self):
        if not self._metastack:
            raise Refused("it needs a MARK that is not there")
        items, self._stack = self._stack, self._metastack.pop()
        return items

    def _push_new(self, obj):
        """Push an object built in this load (it may be mutated)."""
        self._objects_left -= 1
        if self._objects_left < 0:
            raise Refused("it builds more containers and objects than the load's byte limit "
                          "allows at ~100 bytes each (load(..., max_bytes=N) or "
                          "SPMDNET_LOAD_MAX_BYTES raises it)")
        self._own.add(id(obj))
        self._keep.append(obj)
        if type(obj) in (tuple, frozenset):
            self._weigh(obj)
        self._stack.append(obj)

    def _owned(self, obj, kinds, what):
        if id(obj) not in self._own or not isinstance(obj, kinds):
            raise Refused(f"{what} onto {describe(obj)}, which is not a container this "
                          "file built")
        return obj

    # -- bounds on what shared references can cost ------------------------------
    def _weigh(self, obj):
        leaves, depth = 1, 1
        for item in obj:
            if type(item) in (tuple, frozenset):
                # one built outside the stream (inside an admitted call) is not
                # measured (that would recurse): it counts as too big to hash
                known = self._weights.get(id(item), (MAX_KEY_LEAVES + 1, MAX_KEY_DEPTH + 1))
                leaves, depth = leaves + known[0], max(depth, known[1] + 1)
                if leaves > MAX_KEY_LEAVES:
                    break
            else:
                leaves += 1
        self._weights[id(obj)] = (leaves, depth)
        self._keep.append(obj)
        return leaves, depth

    def check_key(self, key):
        """A dict key or set item: hashing or comparing it stays cheap."""
        if type(key) in (tuple, frozenset):
            leaves, depth = self._weights.get(id(key)) or self._weigh(key)
            if leaves > MAX_KEY_LEAVES or depth > MAX_KEY_DEPTH:
                raise Refused(f"a {type(key).__name__} used as a dict key or set item "
                              f"expands to more than {MAX_KEY_LEAVES} items or "
                              f"{MAX_KEY_DEPTH} levels")
            self._hash_budget -= leaves  # Python hashes a tuple anew each time
            if self._hash_budget < 0:
                raise Refused("its dict keys and set items, expanded, hold more than 10 "
                              "items per byte of the pickle")
        elif not isinstance(key, _SCALARS):
            try:
                hash(key)
            except TypeError:
                raise Refused(f"{describe(key)} cannot be a dict key or set item "
                              "(unhashable)") from None
        return key

    def _check_depth(self, root):
        """The longest chain of nested containers in the result (shared
        ones counted along every path, cycles cut), without recursion."""
        def children(obj):
            if isinstance(obj, dict):
                extra = vars(obj).values() if type(obj) is collections.OrderedDict else ()
                return [*obj.keys(), *obj.values(), *extra]
            return obj if isinstance(obj, (list, tuple, set, frozenset)) else ()

        depth, on_path = {}, set()
        stack = [(root, iter(children(root)), 1)]
        on_path.add(id(root))
        while stack:
            obj, items, deepest = stack[-1]
            for item in items:
                if isinstance(item, _SCALARS) or id(item) in on_path:
                    continue
                if id(item) in depth:
                    deepest = max(deepest, depth[id(item)] + 1)
                    continue
                if len(stack) >= MAX_DEPTH:
                    raise Refused(f"its containers nest more than {MAX_DEPTH} levels deep")
                stack[-1] = (obj, items, deepest)
                stack.append((item, iter(children(item)), 1))
                on_path.add(id(item))
                break
            else:
                if deepest > MAX_DEPTH:  # a path through containers measured before
                    raise Refused(f"its containers nest more than {MAX_DEPTH} levels deep")
                stack.pop()
                on_path.discard(id(obj))
                depth[id(obj)] = deepest
                if stack:
                    parent, parent_items, parent_deepest = stack[-1]
                    stack[-1] = (parent, parent_items, max(parent_deepest, deepest + 1))

    def _persistent(self, pid):
        try:
            return self.persistent_load(pid)
        except Refused:
            raise
        except Exception as e:
            raise _Foreign(e) from None

    # -- calls: every global, call and state update goes through the policy ------
    def _call(self, func, args):
        if type(args) is not tuple:
            raise Refused(f"the arguments of a call are {describe(args)}, not a tuple")
        try:
            result = self.call(func, args)
        except Refused:
            raise
        except Exception as e:  # an allowed function refusing its arguments
            raise Refused(f"calling {getattr(func, '__name__', describe(func))} failed: "
                          f"{short_error(e)}") from None
        self._push_new(result)

    def _new(self, cls, args, kwargs):
        if type(args) is not tuple or type(kwargs) is not dict:
            raise Refused(f"NEWOBJ takes a tuple and a dict, got {describe(args)} and "
                          f"{describe(kwargs)}")
        try:
            result = self.new(cls, args, kwargs)
        except Refused:
            raise
        except Exception as e:
            raise Refused(f"creating {getattr(cls, '__name__', describe(cls))} failed: "
                          f"{short_error(e)}") from None
        self._push_new(result)

    def _global(self, module, name):
        if type(module) is not str or type(name) is not str:
            raise Refused(f"a global's module and name must be str, got {describe(module)} "
                          f"and {describe(name)}")
        self._stack.append(self.find_global(module, name))
