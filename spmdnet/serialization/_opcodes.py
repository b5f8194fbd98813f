"""The opcodes of pickle protocols 0 to 5 (``pickletools.opcodes``), one
method each, over ``_unpickler.Machine``'s stack, memo and checks: what
each reads from the stream and what it builds. Opcodes without a method
here (EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER) are refused by the loop.
"""
import codecs
import collections

from ._unpickler import Machine, Refused, describe, short_error


class SafeUnpickler(Machine):
    """``SafeUnpickler(data, encoding).load()``: pickle's opcodes, each
    building only plain data or asking the policy methods."""

    # -- opcodes: protocol 0 and 1 ---------------------------------------------
    def _op_MARK(self):
        self._metastack.append(self._stack)
        self._stack = []

    def _op_STOP(self):
        return True

    def _op_POP(self):
        if self._stack:
            self._stack.pop()
        else:
            self._pop_mark()

    def _op_POP_MARK(self):
        self._pop_mark()

    def _op_DUP(self):
        self._stack.append(self._pop())
        self._stack.append(self._stack[-1])

    def _op_FLOAT(self):
        try:
            self._stack.append(float(self._line()))
        except ValueError:
            raise Refused("a FLOAT that is not a number") from None

    def _op_INT(self):
        line = self._line()
        bools = {b"00": False, b"01": True}  # protocol 0 writes bools as INT
        self._stack.append(bools[line] if line in bools else self._text_int(line))

    def _op_LONG(self):
        line = self._line()
        self._stack.append(self._text_int(line[:-1] if line.endswith(b"L") else line))

    def _op_BININT(self):
        self._stack.append(self._unpack("<i"))

    def _op_BININT1(self):
        self._stack.append(self._take(1)[0])

    def _op_BININT2(self):
        self._stack.append(self._unpack("<H"))

    def _op_LONG1(self):
        self._stack.append(int.from_bytes(self._take(self._take(1)[0]), "little", signed=True))

    def _op_LONG4(self):
        self._stack.append(int.from_bytes(self._take(self._unpack("<i")), "little",
                                          signed=True))

    def _op_NONE(self):
        self._stack.append(None)

    def _op_NEWTRUE(self):
        self._stack.append(True)

    def _op_NEWFALSE(self):
        self._stack.append(False)

    def _op_BINFLOAT(self):
        self._stack.append(self._unpack(">d"))

    def _string(self, raw):
        """Python 2 ``str`` data, decoded as ``load(encoding=...)`` says."""
        if self._encoding == "bytes":
            return raw
        try:
            return raw.decode(self._encoding)
        except (UnicodeDecodeError, LookupError) as e:
            raise Refused(f"a Python 2 string does not decode as {self._encoding!r} "
                          f"({short_error(e)})") from None

    def _op_STRING(self):
        line = self._line()
        if len(line) < 2 or line[:1] not in b"'\"" or line[-1:] != line[:1]:
            raise Refused("a STRING that is not quoted")
        try:
            raw = codecs.escape_decode(line[1:-1])[0]
        except ValueError:
            raise Refused("a STRING with a bad escape") from None
        self._stack.append(self._string(raw))

    def _op_BINSTRING(self):
        self._stack.append(self._string(self._take(self._unpack("<i"))))

    def _op_SHORT_BINSTRING(self):
        self._stack.append(self._string(self._take(self._take(1)[0])))

    def _unicode(self, raw, codec="utf-8"):
        try:
            return raw.decode(codec, "surrogatepass")
        except UnicodeDecodeError:
            raise Refused("a string that is not valid UTF-8") from None

    def _op_UNICODE(self):
        self._stack.append(self._unicode(self._line(), "raw-unicode-escape"))

    def _op_BINUNICODE(self):
        self._stack.append(self._unicode(self._take(self._unpack("<I"))))

    def _op_SHORT_BINUNICODE(self):
        self._stack.append(self._unicode(self._take(self._take(1)[0])))

    def _op_BINUNICODE8(self):
        self._stack.append(self._unicode(self._take(self._unpack("<Q"))))

    def _op_BINBYTES(self):
        self._stack.append(self._take(self._unpack("<I")))

    def _op_SHORT_BINBYTES(self):
        self._stack.append(self._take(self._take(1)[0]))

    def _op_BINBYTES8(self):
        self._stack.append(self._take(self._unpack("<Q")))

    def _op_BYTEARRAY8(self):
        self._push_new(bytearray(self._take(self._unpack("<Q"))))

    def _op_EMPTY_TUPLE(self):
        self._stack.append(())

    def _op_TUPLE(self):
        self._push_new(tuple(self._pop_mark()))

    def _op_TUPLE1(self):
        self._push_new((self._pop(),))

    def _op_TUPLE2(self):
        second = self._pop()
        self._push_new((self._pop(), second))

    def _op_TUPLE3(self):
        third, second = self._pop(), self._pop()
        self._push_new((self._pop(), second, third))

    def _op_EMPTY_LIST(self):
        self._push_new([])

    def _op_LIST(self):
        self._push_new(self._pop_mark())

    def _op_APPEND(self):
        item = self._pop()
        self._owned(self._top(), list, "APPEND").append(item)

    def _op_APPENDS(self):
        items = self._pop_mark()
        self._owned(self._top(), list, "APPENDS").extend(items)

    def _op_EMPTY_DICT(self):
        self._push_new({})

    def _op_DICT(self):
        items = self._pop_mark()
        if len(items) % 2:
            raise Refused("DICT with an odd number of items")
        self._push_new({self.check_key(items[i]): items[i + 1]
                        for i in range(0, len(items), 2)})

    def _setitems(self, items):
        target = self._owned(self._top(), (dict, collections.OrderedDict), "SETITEM")
        if len(items) % 2:
            raise Refused("SETITEMS with an odd number of items")
        for i in range(0, len(items), 2):
            target[self.check_key(items[i])] = items[i + 1]

    def _op_SETITEM(self):
        value = self._pop()
        key = self._pop()
        self._setitems([key, value])

    def _op_SETITEMS(self):
        self._setitems(self._pop_mark())

    def _op_EMPTY_SET(self):
        self._push_new(set())

    def _op_ADDITEMS(self):
        items = self._pop_mark()
        target = self._owned(self._top(), set, "ADDITEMS")
        target.update(self.check_key(item) for item in items)

    def _op_FROZENSET(self):
        self._push_new(frozenset(self.check_key(item) for item in self._pop_mark()))

    # -- memo --------------------------------------------------------------------
    def _get(self, index):
        if index not in self._memo:
            raise Refused(f"memo index {index} was never put")
        self._stack.append(self._memo[index])

    def _put(self, index):
        if index < 0:
            raise Refused(f"negative memo index {index}")
        self._memo[index] = self._top()

    def _op_GET(self):
        self._get(self._text_int(self._line()))

    def _op_BINGET(self):
        self._get(self._take(1)[0])

    def _op_LONG_BINGET(self):
        self._get(self._unpack("<I"))

    def _op_PUT(self):
        self._put(self._text_int(self._line()))

    def _op_BINPUT(self):
        self._put(self._take(1)[0])

    def _op_LONG_BINPUT(self):
        self._put(self._unpack("<I"))

    def _op_MEMOIZE(self):
        self._put(len(self._memo))

    # -- globals, calls, state, persistent ids ------------------------------------
    def _op_GLOBAL(self):
        module = self._unicode(self._line())
        self._global(module, self._unicode(self._line()))

    def _op_STACK_GLOBAL(self):
        name = self._pop()
        self._global(self._pop(), name)

    def _op_REDUCE(self):
        args = self._pop()
        self._call(self._pop(), args)

    def _op_INST(self):
        module = self._unicode(self._line())
        name = self._unicode(self._line())
        args = tuple(self._pop_mark())
        self._global(module, name)
        self._call(self._pop(), args)

    def _op_OBJ(self):
        items = self._pop_mark()
        if not items:
            raise Refused("OBJ without a class")
        self._call(items[0], tuple(items[1:]))

    def _op_NEWOBJ(self):
        args = self._pop()
        self._new(self._pop(), args, {})

    def _op_NEWOBJ_EX(self):
        kwargs, args = self._pop(), self._pop()
        self._new(self._pop(), args, kwargs)

    def _op_BUILD(self):
        state = self._pop()
        obj = self._top()
        if id(obj) not in self._own:
            raise Refused(f"BUILD onto {describe(obj)}, which this file did not create "
                          "(a class, a function or a shared object)")
        try:
            self.build(obj, state)
        except Refused:
            raise
        except Exception as e:
            raise Refused(f"setting the state of {describe(obj)} failed: "
                          f"{short_error(e)}") from None

    def _op_PERSID(self):
        self._stack.append(self._persistent(self._unicode(self._line(), "ascii")))

    def _op_BINPERSID(self):
        self._stack.append(self._persistent(self._pop()))

    # -- framing and protocol ---------------------------------------------------
    def _op_PROTO(self):
        version = self._take(1)[0]
        if version > 5:
            raise Refused(f"pickle protocol {version} (this reader knows 0 to 5)")

    def _op_FRAME(self):
        size = self._unpack("<Q")
        if size > len(self._data) - self._pos:
            raise Refused(f"a frame of {size} bytes past the end of the pickle")
