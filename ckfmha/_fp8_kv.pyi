from ckfmha.aliasing import Region

class KvScales:
    @property
    def regions(self) -> list[Region]: ...
