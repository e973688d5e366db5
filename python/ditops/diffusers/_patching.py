"""What enable changes in a model, recorded so that disable restores exactly that.

Two kinds of change, both on module instances (never on classes, so other models of the same
class are untouched):
  * an attention processor replaced through the module's own set_processor;
  * a module's forward replaced inside diffusers' hook chain (diffusers.hooks.HookRegistry): one
    ditops hook per module, always the innermost hook, so the hooks a user registers before or
    after enable (enable_cache, apply_first_block_cache, enable_group_offload) wrap ditops's
    forward exactly as they wrap the class's. disable takes the hook out of the chain again and
    removes the registry where enable made it.
A plan is built completely (and every refusal raised) before the first change is applied.
"""
from __future__ import annotations

import functools
import types
import warnings

# The name of ditops's hook in a module's diffusers HookRegistry.
HOOK_NAME = "ditops.diffusers"


def _registry_class():
    from diffusers.hooks.hooks import HookRegistry
    return HookRegistry


def _is_class_forward(module, forward) -> bool:
    """forward is the class's forward bound to module (what module.forward is without an
    instance attribute)."""
    return getattr(forward, "__self__", None) is module and getattr(forward, "__func__", None) is type(module).forward


class _DitopsHook:
    """The ModelHook (diffusers.hooks.ModelHook's protocol) that runs ditops's forward in place of
    the module's own: diffusers calls new_forward where the hook chain reaches the module's code.
    forward is the bound forward of the latest patch of the module (the FP8 forwards layer over
    the sites'); wrapper is what the hook chain calls (the module's forward while no hook is
    outside it)."""

    _is_stateful = False

    def __init__(self, module, forward):
        self.forward = forward
        self.fn_ref = None
        self.wrapper = None

    def initialize_hook(self, module):
        return module

    def deinitalize_hook(self, module):  # diffusers' spelling
        return module

    def pre_forward(self, module, *args, **kwargs):
        return args, kwargs

    def post_forward(self, module, output):
        return output

    def new_forward(self, module, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def detach_hook(self, module):
        return module

    def reset_state(self, module):
        return module

    def __repr__(self):
        return "ditops.diffusers forward"


def ditops_hook(module):
    """The ditops hook of module, or None."""
    registry = module.__dict__.get("_diffusers_hook")
    return None if registry is None else registry.hooks.get(HOOK_NAME)


def only_ditops_hooks(module) -> bool:
    """module's forward is ditops's (its registry holds the ditops hook and nothing else, and the
    module's forward is that hook's chain)."""
    registry = module.__dict__.get("_diffusers_hook")
    if registry is None or list(registry.hooks) != [HOOK_NAME]:
        return False
    return module.__dict__.get("forward") is registry.hooks[HOOK_NAME].wrapper


def foreign_hooks(module) -> list:
    """The names of the diffusers hooks on module other than ditops's."""
    registry = module.__dict__.get("_diffusers_hook")
    return [] if registry is None else [n for n in registry._hook_order if n != HOOK_NAME]


def _install_hook(module, hook) -> bool:
    """Puts hook innermost in module's diffusers hook chain; True when it made the registry."""
    HookRegistry = _registry_class()
    made = "_diffusers_hook" not in module.__dict__
    registry = HookRegistry.check_if_exists_or_initialize(module)
    if not registry._fn_refs:
        registry.register_hook(hook, HOOK_NAME)
        hook.wrapper = module.__dict__["forward"]
        return made
    # Hooks already there: ditops goes below them (diffusers appends a new hook outermost, where a
    # hook that replaces the forward would hide the others), in the slot of the code the innermost
    # hook reaches: its original_forward (a hook with new_forward) or its forward.
    from diffusers.hooks.hooks import HookFunctionReference
    first = registry._fn_refs[0]
    base = first.original_forward if first.original_forward is not None else first.forward
    fn_ref = HookFunctionReference()
    fn_ref.pre_forward, fn_ref.post_forward = hook.pre_forward, hook.post_forward
    fn_ref.original_forward = base
    fn_ref.forward = functools.update_wrapper(functools.partial(hook.new_forward, module), hook.new_forward)

    def chained(module_, *args, **kwargs):
        args, kwargs = fn_ref.pre_forward(module_, *args, **kwargs)
        return fn_ref.post_forward(module_, fn_ref.forward(*args, **kwargs))

    hook.wrapper = functools.update_wrapper(functools.partial(chained, module), base)
    hook.fn_ref = fn_ref
    if first.original_forward is not None:
        first.original_forward = hook.wrapper
    else:
        first.forward = hook.wrapper
    registry.hooks[HOOK_NAME] = hook
    registry._hook_order.insert(0, HOOK_NAME)
    registry._fn_refs.insert(0, fn_ref)
    return made


def _remove_hook(module, hook, made_registry: bool) -> str:
    """Takes hook out of module's chain (the hooks outside it then reach what it replaced); removes
    the registry where _install_hook made it and nothing else is left in it. Returns why nothing
    was changed, or ''."""
    registry = module.__dict__.get("_diffusers_hook")
    if registry is None or registry.hooks.get(HOOK_NAME) is not hook:
        return "its diffusers hook registry was replaced after enable"
    index = registry._hook_order.index(HOOK_NAME)
    fn_ref = registry._fn_refs[index]
    base = fn_ref.original_forward
    if index == len(registry._fn_refs) - 1:
        if module.__dict__.get("forward") is not hook.wrapper:
            return "forward was replaced after enable"
        if _is_class_forward(module, base):
            del module.forward
        else:
            module.forward = base
    else:
        outer = registry._fn_refs[index + 1]
        if outer.original_forward is hook.wrapper:
            outer.original_forward = base
        elif outer.forward is hook.wrapper:
            outer.forward = base
        else:
            return "the diffusers hook outside ditops's no longer calls it"
    del registry.hooks[HOOK_NAME]
    registry._hook_order.pop(index)
    registry._fn_refs.pop(index)
    if made_registry and not registry.hooks and module.__dict__.get("_diffusers_hook") is registry:
        del module._diffusers_hook
    return ""


def invalidate_registry_caches(model) -> None:
    """Registries cache the list of their descendants' registries (diffusers >= 0.42: the cache
    contexts walk it); enable and disable add and remove block registries, so the caches go."""
    for module in model.modules():
        registry = module.__dict__.get("_diffusers_hook")
        if registry is not None and getattr(registry, "_child_registries_cache", None) is not None:
            registry._child_registries_cache = None


class _ForwardPatch:
    def __init__(self, path, module, forward):
        self.path, self.module, self.forward = path, module, forward
        self.bound = None
        self.hook = None
        self.previous = None        # the forward of the ditops patch this one layers over
        self.made_registry = False

    def apply(self):
        self.bound = types.MethodType(self.forward, self.module)
        hook = ditops_hook(self.module)
        if hook is not None:  # a second ditops patch of the module (FP8 over the sites)
            self.hook, self.previous = hook, hook.forward
            hook.forward = self.bound
            return
        self.hook = _DitopsHook(self.module, self.bound)
        self.made_registry = _install_hook(self.module, self.hook)

    def restore(self) -> str:
        hook = self.hook
        if hook is None or hook.forward is not self.bound:
            return f"{self.path}.forward was replaced after enable; left as it is"
        if self.previous is not None:
            hook.forward = self.previous
            return ""
        why = _remove_hook(self.module, hook, self.made_registry)
        if not why:
            return ""
        # Something holds the hook's chain (accelerate's sequential offloading wraps the forward of
        # a block with parameters of its own after enable): the hook stays there and runs the
        # module's own forward from now on.
        hook.forward = types.MethodType(type(self.module).forward, self.module)
        return f"{self.path}: {why}; ditops's hook stays in the chain and runs the module's own forward"


class _ProcessorPatch:
    def __init__(self, path, attn, processor):
        self.path, self.attn, self.processor = path, attn, processor
        self.original = None

    def apply(self):
        self.original = self.attn.processor
        self.attn.set_processor(self.processor)

    def restore(self) -> str:
        if self.attn.processor is not self.processor:
            return f"{self.path}.processor was replaced after enable; left as it is"
        self.attn.set_processor(self.original)
        return ""


class Plan:
    """The sites of one model and the changes that install them."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix
        self.sites = []
        self.patches = []
        self.skipped: list[tuple[str, str]] = []   # whole modules left as they are, and why

    def add_site(self, site):
        self.sites.append(site)
        return site

    def patch_forward(self, path, module, forward):
        """path '': the model's own forward."""
        path = self.prefix + path if path else (self.prefix.rstrip(".") or type(module).__name__)
        self.patches.append(_ForwardPatch(path, module, forward))

    def patch_processor(self, path, attn, processor):
        self.patches.append(_ProcessorPatch(self.prefix + path, attn, processor))

    def skip(self, path, why):
        self.skipped.append((self.prefix + path, why))

    def apply(self):
        done = []
        try:
            for patch in self.patches:
                patch.apply()
                done.append(patch)
        except BaseException:
            for patch in reversed(done):
                patch.restore()
            raise

    def restore(self):
        for patch in reversed(self.patches):
            why = patch.restore()
            if why:
                warnings.warn(f"ditops.diffusers.disable: {why}", RuntimeWarning, stacklevel=3)
